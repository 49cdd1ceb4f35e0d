//! A file writer for large outputs that goes around the page cache (`O_DIRECT` on Linux), with
//! the disk writes on a thread of their own.
//!
//! Why: a bundle's weight file is as large as the model (2.4 GB for an 8B ternary model) and is
//! synced before the bundle is renamed into place. Written through the page cache, every byte
//! is copied into the cache by the kernel, then written back by `fsync` in small requests:
//! on the 2-core VM of BENCHMARKS.md that is about 0.34 GB/s, against 1.2 GB/s for 8 MiB direct
//! writes (`dd oflag=direct`), and the copy costs CPU the hashes need. Here the caller's bytes
//! are gathered into 8 MiB buffers aligned to 4096 bytes, each handed to an I/O thread that
//! writes it with `O_DIRECT` while the caller fills the next one; the tail that is not a whole
//! 4096-byte block is written through the cache at [`DirectWriter::finish`], then the file is
//! synced.
//!
//! Where `O_DIRECT` is not available (not Linux, or a filesystem such as older tmpfs that
//! refuses it with `EINVAL` at open or at the first write) the same writer writes through the
//! page cache; the bytes are the same either way.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Bytes per buffer handed to the I/O thread.
const CHUNK: usize = 8 << 20;
/// Alignment of direct writes: buffer address, length and file offset.
const ALIGN: usize = 4096;
/// Buffers in flight (one being filled, the rest queued or being written).
const BUFFERS: usize = 3;

/// An 8 MiB buffer whose usable part starts at a 4096-byte boundary.
struct Aligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let raw = vec![0u8; CHUNK + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        Aligned { raw, start, len: 0 }
    }
    fn filled(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    fn spare(&mut self) -> &mut [u8] {
        &mut self.raw[self.start + self.len..self.start + CHUNK]
    }
}

/// Whether `f` was switched to direct I/O.
fn set_direct(f: &File, on: bool) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = f.as_raw_fd();
        // SAFETY: fcntl on a file descriptor this File owns; no memory is passed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 {
                return false;
            }
            let want = if on {
                flags | libc::O_DIRECT
            } else {
                flags & !libc::O_DIRECT
            };
            libc::fcntl(fd, libc::F_SETFL, want) == 0 && on
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (f, on);
        false
    }
}

/// Writes all of `buf` at `offset`.
fn write_at(f: &mut File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        f.write_all_at(buf, offset)
    }
    #[cfg(not(unix))]
    {
        let _ = offset;
        f.write_all(buf)
    }
}

/// The I/O thread: writes each full buffer at the next offset and returns it for reuse. On
/// the first `EINVAL` of a direct write it switches to the page cache for good and writes the
/// same buffer again at the same offset.
fn io_loop(
    f: File,
    direct: bool,
    full: Receiver<Aligned>,
    empty: SyncSender<Aligned>,
) -> std::io::Result<(File, u64)> {
    io_loop_with(f, direct, full, empty, |f, b, o, _| write_at(f, b, o))
}

/// [`io_loop`] with the positioned write as a parameter (tests inject `EINVAL`).
fn io_loop_with(
    mut f: File,
    mut direct: bool,
    full: Receiver<Aligned>,
    empty: SyncSender<Aligned>,
    mut write: impl FnMut(&mut File, &[u8], u64, bool) -> std::io::Result<()>,
) -> std::io::Result<(File, u64)> {
    let mut offset = 0u64;
    for mut buf in full {
        match write(&mut f, buf.filled(), offset, direct) {
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                direct = set_direct(&f, false);
                write(&mut f, buf.filled(), offset, direct)?;
            }
            r => r?,
        }
        offset += buf.len as u64;
        buf.len = 0;
        // The writer may be gone (an error on its side); the buffer is then dropped.
        let _ = empty.send(buf);
    }
    Ok((f, offset))
}

/// See the module documentation. `write` never blocks on the disk unless all buffers are in
/// flight.
pub struct DirectWriter {
    cur: Option<Aligned>,
    full: Option<SyncSender<Aligned>>,
    empty: Receiver<Aligned>,
    io: Option<JoinHandle<std::io::Result<(File, u64)>>>,
}

impl DirectWriter {
    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> std::io::Result<DirectWriter> {
        let f = File::create(path)?;
        let direct = set_direct(&f, true);
        let (full_tx, full_rx) = sync_channel::<Aligned>(BUFFERS);
        let (empty_tx, empty_rx) = sync_channel::<Aligned>(BUFFERS);
        for _ in 1..BUFFERS {
            let _ = empty_tx.send(Aligned::new());
        }
        let io = std::thread::Builder::new()
            .name("lowbit-write".into())
            .spawn(move || io_loop(f, direct, full_rx, empty_tx))?;
        Ok(DirectWriter {
            cur: Some(Aligned::new()),
            full: Some(full_tx),
            empty: empty_rx,
            io: Some(io),
        })
    }

    /// The I/O thread's error, once it has stopped.
    fn io_error(&mut self) -> std::io::Error {
        self.full = None;
        match self.io.take().map(|h| h.join()) {
            Some(Ok(Err(e))) => e,
            _ => std::io::Error::other("the write thread stopped"),
        }
    }

    /// Hands the current buffer to the I/O thread and takes an empty one.
    fn send_current(&mut self) -> std::io::Result<()> {
        let buf = self.cur.take().expect("current buffer");
        let sent = self.full.as_ref().map(|tx| tx.send(buf).is_ok());
        if sent != Some(true) {
            return Err(self.io_error());
        }
        match self.empty.recv() {
            Ok(b) => {
                self.cur = Some(b);
                Ok(())
            }
            Err(_) => Err(self.io_error()),
        }
    }

    /// Writes what is buffered (the last, partial block through the page cache), waits for the
    /// I/O thread and syncs the file to disk.
    pub fn finish(mut self) -> std::io::Result<()> {
        let mut cur = self.cur.take().expect("current buffer");
        let whole = cur.len / ALIGN * ALIGN;
        let tail = cur.filled()[whole..].to_vec();
        cur.len = whole;
        if whole > 0 {
            let sent = self.full.as_ref().map(|tx| tx.send(cur).is_ok());
            if sent != Some(true) {
                return Err(self.io_error());
            }
        }
        self.full = None;
        let (mut f, offset) = match self.io.take().map(|h| h.join()) {
            Some(Ok(r)) => r?,
            _ => return Err(std::io::Error::other("the write thread panicked")),
        };
        if !tail.is_empty() {
            set_direct(&f, false);
            write_at(&mut f, &tail, offset)?;
        }
        f.sync_all()
    }
}

impl Write for DirectWriter {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let cur = self.cur.as_mut().expect("current buffer");
            let spare = cur.spare();
            let k = spare.len().min(buf.len());
            spare[..k].copy_from_slice(&buf[..k]);
            cur.len += k;
            buf = &buf[k..];
            if cur.len == CHUNK {
                self.send_current()?;
            }
        }
        Ok(n)
    }
    /// Buffers are written as they fill; [`DirectWriter::finish`] writes the rest.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads all of `buf` at `offset`, or up to the end of the file; returns the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        #[cfg(unix)]
        let k = {
            use std::os::unix::fs::FileExt;
            f.read_at(&mut buf[n..], offset + n as u64)
        };
        #[cfg(not(unix))]
        let k = {
            use std::io::{Read, Seek, SeekFrom};
            let mut g = f;
            g.seek(SeekFrom::Start(offset + n as u64))
                .and_then(|_| g.read(&mut buf[n..]))
        };
        match k {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads `path` front to back in 8 MiB windows and calls `visit(offset, window)` with each, in
/// order, on the calling thread, while an I/O thread reads the next ones (`O_DIRECT` where the
/// filesystem allows it, so the file does not go through the page cache: on the VM of
/// BENCHMARKS.md a cold buffered read of 2.4 GB costs 5.5 CPU-seconds in the kernel, a direct
/// read 0.4). Returns the number of bytes read. An error of `visit` stops the read and is
/// returned.
pub fn read_windows(
    path: &Path,
    mut visit: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    let f = File::open(path)?;
    let direct = set_direct(&f, true);
    let (full_tx, full_rx) = sync_channel::<std::io::Result<Aligned>>(BUFFERS);
    let (empty_tx, empty_rx) = sync_channel::<Aligned>(BUFFERS);
    for _ in 0..BUFFERS {
        let _ = empty_tx.send(Aligned::new());
    }
    // `move`: the receiving end and the pool are dropped when this closure returns (also on
    // an error of `visit`), which ends a reader blocked on either, before the scope joins it.
    std::thread::scope(move |s| {
        s.spawn(move || {
            let mut direct = direct;
            let mut offset = 0u64;
            for mut buf in empty_rx {
                let start = buf.start;
                let window = &mut buf.raw[start..start + CHUNK];
                let r = match read_full_at(&f, window, offset) {
                    Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                        direct = set_direct(&f, false);
                        read_full_at(&f, window, offset)
                    }
                    r => r,
                };
                let n = match r {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = full_tx.send(Err(e));
                        return;
                    }
                };
                buf.len = n;
                offset += n as u64;
                if full_tx.send(Ok(buf)).is_err() || n < CHUNK {
                    return;
                }
            }
        });
        let mut pos = 0u64;
        for r in full_rx.iter() {
            let buf = r?;
            let n = buf.len;
            if n > 0 {
                visit(pos, buf.filled())?;
            }
            pos += n as u64;
            if n < CHUNK {
                break;
            }
            // The reader may have stopped; the buffer is then dropped.
            let _ = empty_tx.send(buf);
        }
        // Closing the pool ends the reader if it waits for a buffer.
        drop(empty_tx);
        Ok(pos)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_window_in_order() {
        let dir = std::env::temp_dir().join(format!("lowbit-direct-r-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for size in [0usize, 1, 4097, CHUNK, CHUNK + 1, 3 * CHUNK + 12345] {
            let want: Vec<u8> = (0..size).map(|i| (i * 13 + i / 4099) as u8).collect();
            let p = dir.join(format!("r{size}"));
            std::fs::write(&p, &want).unwrap();
            let mut got = Vec::new();
            let n = read_windows(&p, |pos, w| {
                assert_eq!(pos as usize, got.len());
                got.extend_from_slice(w);
                Ok(())
            })
            .unwrap();
            assert_eq!((n as usize, got == want), (size, true), "size {size}");
        }
        // An error of the visitor stops the read and comes back.
        let p = dir.join(format!("r{}", 3 * CHUNK + 12345));
        let e = read_windows(&p, |pos, _| {
            if pos > 0 {
                Err(std::io::Error::other("stop"))
            } else {
                Ok(())
            }
        });
        assert_eq!(e.unwrap_err().to_string(), "stop");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A direct write refused with `EINVAL` (a file system that takes O_DIRECT at open but not
    /// these buffers) is written again through the page cache at the same offset, and every
    /// later buffer goes through the page cache too.
    #[test]
    fn einval_on_a_direct_write_falls_back_to_the_page_cache() {
        let p = std::env::temp_dir().join(format!("lowbit-direct-einval-{}", std::process::id()));
        let f = File::create(&p).unwrap();
        let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<Aligned>(4);
        let (empty_tx, _empty_rx) = std::sync::mpsc::sync_channel::<Aligned>(4);
        let mut want = Vec::new();
        for k in 0..3u8 {
            let mut b = Aligned::new();
            let n = CHUNK - 4096 * k as usize;
            b.spare()[..n].fill(k + 1);
            b.len = n;
            want.extend(std::iter::repeat_n(k + 1, n));
            full_tx.send(b).unwrap();
        }
        drop(full_tx);
        let mut calls = Vec::new();
        let (f, n) = io_loop_with(f, true, full_rx, empty_tx, |f, b, o, direct| {
            calls.push((o, direct));
            if direct {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            write_at(f, b, o)
        })
        .unwrap();
        drop(f);
        let c0 = CHUNK as u64;
        assert_eq!(
            calls,
            vec![(0, true), (0, false), (c0, false), (2 * c0 - 4096, false)]
        );
        assert_eq!(n as usize, want.len());
        assert!(std::fs::read(&p).unwrap() == want);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn writes_the_same_bytes_at_every_size() {
        let dir = std::env::temp_dir().join(format!("lowbit-direct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for size in [
            0usize,
            1,
            4095,
            4096,
            4097,
            CHUNK - 1,
            CHUNK,
            3 * CHUNK + 12345,
        ] {
            let want: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4099) as u8).collect();
            let p = dir.join(format!("f{size}"));
            let mut w = DirectWriter::create(&p).unwrap();
            // Uneven pieces, so buffer boundaries fall inside writes.
            for piece in want.chunks(1_000_003) {
                w.write_all(piece).unwrap();
            }
            w.finish().unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), want, "size {size}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

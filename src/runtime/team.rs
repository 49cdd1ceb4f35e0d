//! A decode step run by a team of the rayon pool's workers in lockstep.
//!
//! A decode step (one token) is about 10 short parallel loops a layer (the 7 weight products,
//! the gate, the attention's heads), each a few microseconds to a few hundred of work. Over
//! rayon each loop is a fork-join: the idle workers have to notice the new job, steal a half,
//! split it again, and the caller waits for the last piece; on a 2-core Intel VM two threads
//! ran Gemma 3 270M's decode only 1.40x faster than one, where llama.cpp's threads, which spin
//! between ops, gain 1.88x (BENCHMARKS.md, "Decode below llama.cpp on the Intel VM").
//!
//! [`decode_step`] holds the pool's other workers for the whole step: each spins (then
//! yields) on one shared word until the step's thread publishes a loop, claims the loop's
//! items one at a time by compare-and-swap on that word, and reports how many it ran. The
//! step's thread runs items too and waits until all are done. Inside a step, [`for_each`] and
//! [`map`] use the team; outside one they are rayon's parallel loops. Which thread runs an item
//! never changes what the item computes, so the results are the same bits either way.
//!
//! `LOWBIT_CPU_TEAM=0` turns the team off (every loop then goes through rayon), for
//! measurement.

use rayon::prelude::*;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// [`Team::claim`] packs the current loop's number (the top [`NUM_BITS`]), its item count
/// and its next unclaimed item ([`ITEM_BITS`] each) in one word, so that a claim succeeds
/// only against the loop and count it was made for: a worker still looking at an earlier loop
/// (or at a count read after the step thread moved on) fails its compare-and-swap.
const ITEM_BITS: u32 = 20;
const NUM_BITS: u32 = 64 - 2 * ITEM_BITS;
const ITEM_MASK: u64 = (1 << ITEM_BITS) - 1;
const NUM_MASK: u64 = (1 << NUM_BITS) - 1;

/// The claim word of loop `num` with `count` items, `next` of them claimed.
fn pack(num: u64, count: usize, next: usize) -> u64 {
    (num << (2 * ITEM_BITS)) | ((count as u64) << ITEM_BITS) | next as u64
}

/// `(num, count, next)` of a claim word.
fn unpack(v: u64) -> (u64, usize, usize) {
    (
        v >> (2 * ITEM_BITS),
        ((v >> ITEM_BITS) & ITEM_MASK) as usize,
        (v & ITEM_MASK) as usize,
    )
}

/// Rounds of `spin_loop` before a waiting thread starts to yield its core between checks.
const SPINS: u32 = 1 << 14;

/// A loop's body as the team runs it.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Team {
    /// The current loop's number, item count and next item ([`pack`]).
    claim: AtomicU64,
    /// The current loop's body: a pointer to a [`Job`] on the step thread's stack, valid while
    /// the loop has unfinished items (the step thread does not return before they are done).
    job: AtomicPtr<()>,
    /// Items of the current loop the helpers have finished.
    done: AtomicUsize,
    /// The step is over: helpers return.
    quit: AtomicBool,
    /// The first panic of an item of the current loop, raised again on the step thread once
    /// every item is done (an item that panics counts as done, so no thread waits for it).
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

thread_local! {
    /// The team of the step this thread is running, if any (set by [`decode_step`]).
    static ACTIVE: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Whether [`decode_step`] forms a team (`LOWBIT_CPU_TEAM`, default on).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| super::env_switch("LOWBIT_CPU_TEAM", true))
}

/// Waits for `ready`: spins, then yields the core between checks (a helper whose step thread
/// was descheduled, or a machine with fewer cores than threads, must not starve it).
#[inline]
fn wait_until(mut ready: impl FnMut() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Team {
    /// Claims and runs items of loop `num` until none is left; returns how many this thread
    /// ran.
    fn work(&self, num: u64, job: Job) -> usize {
        let mut ran = 0;
        let mut v = self.claim.load(Ordering::Acquire);
        loop {
            let (at, count, next) = unpack(v);
            if at != num || next >= count {
                return ran;
            }
            match self
                .claim
                .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => {
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| job(next))) {
                        self.panic
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(p);
                    }
                    ran += 1;
                    v = self.claim.load(Ordering::Acquire);
                }
                Err(now) => v = now,
            }
        }
    }

    /// A helper: runs items of each loop the step thread publishes until the step is over.
    fn help(&self) {
        let mut seen = unpack(self.claim.load(Ordering::Acquire)).0;
        loop {
            let mut v = 0;
            wait_until(|| {
                v = self.claim.load(Ordering::Acquire);
                unpack(v).0 != seen || self.quit.load(Ordering::Acquire)
            });
            if self.quit.load(Ordering::Acquire) {
                return;
            }
            seen = unpack(v).0;
            let ptr = self.job.load(Ordering::Acquire) as *const Job;
            // SAFETY: `work` calls the job only after a claim of loop `seen` succeeded, and
            // while an item of loop `seen` is claimed and not reported done, its step thread
            // is inside `run` with the job alive. The job was stored before the claim word of
            // loop `seen` (read above with Acquire), so it is that loop's or a later one's; a
            // later one's means the step thread has moved on, and every claim against `seen`
            // then fails.
            let job: Job = unsafe { *ptr };
            let ran = self.work(seen, job);
            if ran > 0 {
                self.done.fetch_add(ran, Ordering::Release);
            }
        }
    }

    /// The step thread: publishes a loop of `count` items, runs items itself, and returns
    /// when all are done.
    fn run(&self, count: usize, job: Job) {
        let num = (unpack(self.claim.load(Ordering::Relaxed)).0 + 1) & NUM_MASK;
        self.done.store(0, Ordering::Relaxed);
        self.job
            .store(&job as *const Job as *mut (), Ordering::Relaxed);
        self.claim.store(pack(num, count, 0), Ordering::Release);
        let mine = self.work(num, job);
        if mine < count {
            wait_until(|| self.done.load(Ordering::Acquire) + mine >= count);
        }
        let panic = self.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

/// Sets [`ACTIVE`] for the step and, however the step ends (a panic too), ends it: clears
/// [`ACTIVE`] and tells the helpers to return.
struct StepGuard<'a>(&'a Team);

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        ACTIVE.with(|a| a.set(std::ptr::null()));
        self.0.quit.store(true, Ordering::Release);
    }
}

/// Runs `body` (a decode step) with the current rayon pool's other workers held as its team:
/// inside it, [`for_each`] and [`map`] run on the team. Without a pool of two or more
/// threads, off a pool worker, inside another step, or with `LOWBIT_CPU_TEAM=0`, just runs
/// `body`. Nothing inside the step may wait on rayon jobs while a team is held (its loops go
/// through [`for_each`] and [`map`]); a worker that never joins the team costs nothing but its
/// share of the work.
pub(crate) fn decode_step<R: Send>(body: impl FnOnce() -> R + Send) -> R {
    let helpers = rayon::current_num_threads().saturating_sub(1);
    if helpers == 0
        || rayon::current_thread_index().is_none()
        || !ACTIVE.with(|a| a.get().is_null())
        || !enabled()
    {
        return body();
    }
    let team = Team {
        claim: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        done: AtomicUsize::new(0),
        quit: AtomicBool::new(false),
        panic: Mutex::new(None),
    };
    rayon::scope(|s| {
        for _ in 0..helpers {
            s.spawn(|_| team.help());
        }
        let _guard = StepGuard(&team);
        ACTIVE.with(|a| a.set(&team));
        body()
    })
}

/// The team of the step this thread runs, if any.
fn active() -> Option<&'static Team> {
    let p = ACTIVE.with(|a| a.get());
    // SAFETY: ACTIVE points at the team of a `decode_step` on this thread's stack, and is
    // cleared before that frame ends; the reference is used only within the call that
    // fetched it, inside that step.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Runs `f(i)` for every `i` in `0..n`, on the step's team inside [`decode_step`], else over
/// rayon's pool. `f` must not itself wait on other threads' work.
pub(crate) fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    match active() {
        Some(team) if n > 1 && (n as u64) <= ITEM_MASK => team.run(n, &f),
        Some(_) => (0..n).for_each(f),
        None => (0..n).into_par_iter().for_each(&f),
    }
}

/// `(0..n).map(f)` collected in order, computed as [`for_each`] runs its items.
pub(crate) fn map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if active().is_none() {
        return (0..n).into_par_iter().map(&f).collect();
    }
    let out: Vec<Mutex<Option<T>>> = (0..n).map(|_| Mutex::new(None)).collect();
    for_each(n, |i| {
        let v = f(i);
        *out[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item ran")
        })
        .collect()
}

/// `data` in chunks of `size` (the last shorter), `f(index, chunk)` for each: on the step's
/// team inside [`decode_step`], else rayon's `par_chunks_mut`.
pub(crate) fn chunks_mut<T: Send>(data: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    assert!(size > 0, "chunks of 0 elements");
    if !in_step() {
        return data
            .par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
    struct Base<T>(*mut T);
    // SAFETY: items write disjoint chunks of `data` (below), which outlives the loop.
    unsafe impl<T: Send> Sync for Base<T> {}
    let (len, base) = (data.len(), Base(data.as_mut_ptr()));
    for_each(len.div_ceil(size), |i| {
        let at = i * size;
        let base = &base;
        // SAFETY: chunk i is data[at .. at + size] clipped to len: in bounds, and no other
        // item touches it; `data` is borrowed mutably for the whole call.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(at), size.min(len - at)) };
        f(i, chunk)
    });
}

/// Whether this thread is running a step with a team (the loops of [`for_each`] then run on
/// it).
pub(crate) fn in_step() -> bool {
    active().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn every_item_runs_once_in_order_of_results() {
        for threads in [1, 2, 3, 4] {
            pool(threads).install(|| {
                decode_step(|| {
                    assert_eq!(in_step(), threads > 1);
                    for n in [0, 1, 2, 7, 64, 1000] {
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        for_each(n, |i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(
                            hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                            "n = {n}"
                        );
                        let squares = map(n, |i| i * i);
                        assert_eq!(squares, (0..n).map(|i| i * i).collect::<Vec<_>>());
                    }
                });
                assert!(!in_step());
            });
        }
    }

    #[test]
    fn chunks_cover_the_slice_once() {
        for threads in [1, 2, 3] {
            pool(threads).install(|| {
                for step in [false, true] {
                    for (len, size) in [(0, 4), (1, 4), (17, 4), (64, 16), (1000, 7)] {
                        let mut v = vec![0usize; len];
                        let fill = |v: &mut Vec<usize>| {
                            chunks_mut(v, size, |i, c| {
                                for (j, x) in c.iter_mut().enumerate() {
                                    *x += i * size + j + 1;
                                }
                            })
                        };
                        if step {
                            decode_step(|| fill(&mut v));
                        } else {
                            fill(&mut v);
                        }
                        assert_eq!(v, (1..=len).collect::<Vec<_>>(), "{len} by {size}");
                    }
                }
            });
        }
    }

    #[test]
    fn helpers_never_run_an_item_past_its_loop() {
        // A stress of short loops of alternating sizes, the small ones mostly finished by the
        // step thread alone: a helper that read one loop's number and the next loop's item
        // count must not claim an item. (A first layout kept the count apart from the claim
        // word and let it: Qwen2.5's and SmolLM2's decode crashed. The window is narrow, so
        // this test does not reliably catch that layout; the real models' decode in
        // `tests/real_models.rs` runs with the team too.)
        pool(2).install(|| {
            for _ in 0..20 {
                decode_step(|| {
                    for k in 0..2000 {
                        let n = if k % 2 == 0 { 3 } else { 64 };
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        for_each(n, |i| {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                            for j in 0..(n * 4) {
                                std::hint::black_box(j);
                            }
                        });
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                    }
                });
            }
        });
    }

    #[test]
    fn helpers_share_the_work() {
        // With two threads and items that take a while, the helper runs some of them (it
        // joins a step's loops at all).
        pool(2).install(|| {
            let mut helped = false;
            for _ in 0..50 {
                let me = std::thread::current().id();
                let others = AtomicUsize::new(0);
                decode_step(|| {
                    for _ in 0..20 {
                        for_each(64, |_| {
                            if std::thread::current().id() != me {
                                others.fetch_add(1, Ordering::Relaxed);
                            }
                            std::thread::sleep(std::time::Duration::from_micros(20));
                        });
                    }
                });
                if others.load(Ordering::Relaxed) > 0 {
                    helped = true;
                    break;
                }
            }
            assert!(helped, "the helper never ran an item");
        });
    }

    #[test]
    fn a_panicking_step_releases_its_helpers() {
        pool(2).install(|| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                decode_step(|| {
                    for_each(8, |_| {});
                    panic!("step failed");
                })
            }));
            assert!(r.is_err());
            assert!(!in_step());
            // The pool still works and a new step forms.
            decode_step(|| for_each(16, |_| {}));
        });
    }

    #[test]
    fn a_panicking_item_is_raised_on_the_step_thread() {
        pool(2).install(|| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                decode_step(|| {
                    for_each(64, |i| {
                        std::thread::sleep(std::time::Duration::from_micros(10));
                        assert!(i != 40, "item 40 failed");
                    })
                })
            }));
            let msg = r.expect_err("the item's panic reaches the caller");
            let text = msg
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| msg.downcast_ref::<&str>().map(|s| s.to_string()));
            assert_eq!(text.as_deref(), Some("item 40 failed"));
            decode_step(|| for_each(16, |_| {}));
        });
    }

    #[test]
    fn steps_on_several_pool_threads_at_once_finish() {
        // Steps started from several workers at once (as parallel tests or batched callers
        // do): a helper may sit in another step's team; every step still ends.
        pool(2).install(|| {
            (0..8).into_par_iter().for_each(|k| {
                decode_step(|| {
                    for _ in 0..10 {
                        let s: usize = map(32, |i| i + k).into_iter().sum();
                        assert_eq!(s, (0..32).map(|i| i + k).sum::<usize>());
                    }
                })
            });
        });
    }
}

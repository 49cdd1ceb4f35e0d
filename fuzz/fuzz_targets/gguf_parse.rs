//! Fuzzes the GGUF header parser: any input must give `Ok` or a `GgufError` whose offset lies
//! in the input, never a panic or an allocation the input's size does not justify; an `Ok`
//! header must describe tensors that lie inside the input, aligned and without overlap.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use lowbit::gguf::{self, Value};

fuzz_target!(|data: &[u8]| {
    let header = match gguf::parse(Path::new("fuzz.gguf"), data) {
        Ok(h) => h,
        Err(e) => {
            assert!(e.offset <= data.len() as u64, "{e}");
            std::hint::black_box(e.to_string());
            return;
        }
    };
    assert!(matches!(header.version, 2 | 3));
    assert!(header.alignment.is_power_of_two());
    assert_eq!(header.data_offset % header.alignment, 0);
    for (key, value) in &header.metadata {
        std::hint::black_box(key.len());
        touch(value);
        std::hint::black_box(value.to_json_summary());
    }
    let len = data.len() as u64;
    let mut ranges = Vec::new();
    for t in &header.tensors {
        assert!(!t.name.is_empty());
        assert!(t.ne.len() <= gguf::MAX_DIMS);
        let shape = t.shape();
        assert_eq!(shape.len(), t.ne.len());
        let n = t.n_elements();
        assert_eq!(n, t.row_len() * t.n_rows());
        assert_eq!(t.ty.bytes_for(n), Some(t.n_bytes));
        assert_eq!(t.offset % header.alignment, 0);
        assert_eq!(t.abs_offset, header.data_offset + t.offset);
        assert!(t.abs_offset + t.n_bytes <= len);
        std::hint::black_box(&data[t.abs_offset as usize..(t.abs_offset + t.n_bytes) as usize]);
        if t.n_bytes > 0 {
            ranges.push((t.abs_offset, t.abs_offset + t.n_bytes));
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "tensors overlap: {w:?}");
    }
});

/// Reads every part of a value through its accessors.
fn touch(v: &Value) {
    std::hint::black_box((
        v.value_type().name(),
        v.as_u64(),
        v.as_i64(),
        v.as_f64(),
        v.as_bool(),
        v.as_str(),
        v.as_bytes().map(<[u8]>::len),
    ));
    if let Some(items) = v.as_array() {
        for item in items {
            touch(item);
        }
    }
}

//! Debug probe: runs prompt token ids through the CPU backend and compares the last step's
//! logits with a little-endian f32 file (e.g. llama.cpp's llama-debug --save-logits output).
//! Usage: cargo run --release --example logits_probe -- BUNDLE IDS(comma) [REF.bin]
use lowbit::runtime::{self, Backend};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mut be = runtime::load_cpu(std::path::Path::new(&a[1])).unwrap();
    let ids: Vec<u32> = a[2].split(',').map(|s| s.parse().unwrap()).collect();
    let t0 = std::time::Instant::now();
    runtime::run_prompt(&mut be, &ids, 0).unwrap();
    let last = be.logits().unwrap().to_vec();
    eprintln!("{} tokens in {:.3}s", ids.len(), t0.elapsed().as_secs_f64());
    let am = runtime::argmax(&last);
    println!("argmax {am} logit {}", last[am]);
    if let Some(r) = a.get(3) {
        let b = std::fs::read(r).unwrap();
        let refl: Vec<f32> = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let ram = runtime::argmax(&refl);
        let maxd = last
            .iter()
            .zip(&refl)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!(
            "ref argmax {ram} logit {}; max |diff| {maxd}; first {:?} vs {:?}",
            refl[ram],
            &last[..3],
            &refl[..3]
        );
    }
}

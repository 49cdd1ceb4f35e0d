//! Timing probe for the optimal 1-D k-means on real groups: the first `G` rows of a tensor
//! (`F16=1`: the values rounded to f16 first, as a half-precision checkpoint holds them).
//! Usage: cargo run --release --example kmeans_probe -- FILE.gguf TENSOR [G]
use lowbit::gguf::GgufFile;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let f = GgufFile::open(std::path::Path::new(&a[1])).unwrap();
    let t = f.tensors.iter().find(|t| t.name == a[2]).unwrap();
    let g: usize = a.get(3).map(|s| s.parse().unwrap()).unwrap_or(32);
    let shape = t.shape();
    let cols = shape[1] as usize;
    let rb = t.ty.bytes_for(cols as u64).unwrap() as usize;
    let bytes = f.tensor_data(t);
    for grp in 0..4 {
        let mut v = vec![0f32; g * cols];
        lowbit::quant::dequantize(t.ty, &bytes[grp * g * rb..(grp + 1) * g * rb], &mut v).unwrap();
        if std::env::var_os("F16").is_some() {
            v.iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
        }
        let t0 = std::time::Instant::now();
        let (xs, ws) = lowbit::palette::distinct_counts(&v);
        println!("distinct_counts {:.3} ms", t0.elapsed().as_secs_f64() * 1e3);
        let t0 = std::time::Instant::now();
        let g8 = lowbit::palette::palettize_group(
            &v,
            8,
            lowbit::palette::Mode::Kmeans,
            lowbit::palette::Arith::F16,
        )
        .unwrap();
        println!(
            "palettize_group 8-bit {:.3} ms (sse {:.4e})",
            t0.elapsed().as_secs_f64() * 1e3,
            g8.sse
        );
        for k in [256usize, 64, 16] {
            let t0 = std::time::Instant::now();
            let c = lowbit::palette::kmeans::optimal(&xs, &ws, k).expect("memory for the k-means");
            println!(
                "group {grp}: n {} k {k}: {:.2} ms, sse {:.6e}",
                xs.len(),
                t0.elapsed().as_secs_f64() * 1e3,
                c.sse
            );
        }
    }
}

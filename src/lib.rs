//! lowbit: turns quantized LLM checkpoints (GGUF) into deployable low-bit bundles and runs
//! them.
//!
//! Stage 1 (this crate's foundation): [`gguf`] reads GGUF v2/v3 files from a memory map with
//! every field checked; [`quant`] dequantizes every common GGML type to f32 bit-exactly with
//! gguf-py; [`inspect`] and [`export`] back the `convert inspect` and `convert dequantize`
//! commands.

pub mod arch;
pub mod build;
pub mod bundle;
pub mod direct_io;
pub mod eval;
pub mod export;
pub mod ggml;
pub mod gguf;
pub mod inspect;
pub mod isa;
pub mod palette;
pub mod quant;
pub mod runtime;
pub mod ternary;
pub mod tokenizer;
pub mod util;

//! TEMPORARY: the signatures of weights.rs (being written on branch gpu-weights), so the
//! backend compiles until that branch merges. Never called.
#![allow(dead_code, unused_variables)]
use super::{GpuContext, GpuError};

pub struct GpuWeight;
impl GpuWeight {
    pub fn bytes(&self) -> u64 {
        0
    }
}
pub struct Bound;
impl Bound {
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {}
    pub fn dispatches(&self) -> usize {
        0
    }
}
impl GpuContext {
    pub fn upload_model_weight(
        &self,
        bundle: &crate::bundle::reader::Bundle,
        w: &crate::runtime::model::Weight,
    ) -> Result<GpuWeight, GpuError> {
        Err(GpuError::Shape {
            op: "weights",
            detail: "the weight kernels are not merged yet".into(),
        })
    }
    pub fn bind_matmul(
        &self,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_tokens: u32,
    ) -> Result<Bound, GpuError> {
        Err(GpuError::Shape {
            op: "weights",
            detail: "the weight kernels are not merged yet".into(),
        })
    }
    pub fn bind_gather(
        &self,
        w: &GpuWeight,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: u32,
    ) -> Result<Bound, GpuError> {
        Err(GpuError::Shape {
            op: "weights",
            detail: "the weight kernels are not merged yet".into(),
        })
    }
}

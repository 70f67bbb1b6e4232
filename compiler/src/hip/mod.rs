//! HIP code generation for AMD GPUs (MI250 gfx90a, MI300X gfx942).

pub mod backward;
pub mod dialect;
pub mod forward;
pub mod recurrent;
pub mod recurrent_bwd;

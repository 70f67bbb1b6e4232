//! CUDA tensor maps: the descriptors TMA copies (`cp.async.bulk.tensor`)
//! read, encoded on the host with `cuTensorMapEncodeTiled` and passed to a
//! kernel by value (a `__grid_constant__` parameter).

use cudarc::driver::sys::{
    self, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle, cudaError_enum,
};
use cudarc::driver::{DevicePtr, DeviceRepr};

use crate::error::{Result, RuntimeError};
use crate::memory::{DType, DeviceBuffer, Element};
use crate::stream::Stream;

/// A tensor map (`CUtensorMap`, 128 opaque bytes). It holds the address of
/// the buffer it was encoded for: a launch must pass that buffer too (as
/// aec's kernels do), which keeps it alive and orders the launch after its
/// writes.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain-old-data struct of 16 u64 words with the alignment the
// kernel parameter declares; the driver copies its bytes at launch.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for TensorMap {}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap { .. }")
    }
}

/// The largest extent a tensor map takes (2³²) and the box's (256).
const MAX_DIM: u64 = 1 << 32;
const MAX_BOX: u32 = 256;
/// Byte strides must be multiples of 16 and below 2⁴⁰.
const MAX_STRIDE: u64 = 1 << 40;

impl TensorMap {
    /// A rank-3 map over the first `dims[0] · dims[1] · dims[2]` elements of
    /// `buffer` (`name` in messages), row-major with extents `dims`
    /// innermost first, read in boxes of `box_dims` elements into
    /// shared memory with the 128-byte swizzle (the box's inner extent times
    /// the element size must be at most 128 bytes); elements outside the
    /// extents read as zero.
    pub fn tiled_3d<T: Element>(
        stream: &Stream,
        buffer: &DeviceBuffer<T>,
        name: &str,
        dims: [u64; 3],
        box_dims: [u32; 3],
    ) -> Result<TensorMap> {
        let bad =
            |detail: String| RuntimeError::Invalid(format!("tensor map of `{name}`: {detail}"));
        let data_type = match T::DTYPE {
            DType::BF16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            DType::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            DType::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            other => return Err(bad(format!("{other} elements are not supported"))),
        };
        let bytes = T::DTYPE.size_bytes() as u64;
        if let Some(d) = dims.iter().find(|&&d| d == 0 || d > MAX_DIM) {
            return Err(bad(format!("extents {dims:?}: {d} is outside 1 ..= 2^32")));
        }
        if let Some(b) = box_dims.iter().find(|&&b| b == 0 || b > MAX_BOX) {
            return Err(bad(format!("box {box_dims:?}: {b} is outside 1 ..= 256")));
        }
        if u64::from(box_dims[0]) * bytes > 128 {
            return Err(bad(format!(
                "a box row of {} elements is wider than the 128-byte swizzle",
                box_dims[0]
            )));
        }
        let elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        if elements.is_none_or(|n| n > buffer.len() as u64) {
            return Err(bad(format!(
                "extents {dims:?} cover more than the buffer's {} elements",
                buffer.len()
            )));
        }
        let strides = [dims[0] * bytes, dims[0] * dims[1] * bytes];
        if strides.iter().any(|&s| s % 16 != 0 || s >= MAX_STRIDE) {
            return Err(bad(format!(
                "row strides {strides:?} bytes must be multiples of 16 below 2^40"
            )));
        }
        let (address, _sync) = buffer.slice().device_ptr(stream.cuda());
        if address % 16 != 0 {
            return Err(bad(format!("address {address:#x} is not 16-byte aligned")));
        }
        let element_strides = [1u32; 3];
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every array has the rank's length (strides one less), the
        // map is writable and aligned as CUtensorMap, and the extents were
        // checked to lie inside the buffer.
        #[allow(unsafe_code)]
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                data_type,
                3,
                address as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                box_dims.as_ptr(),
                element_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if status != cudaError_enum::CUDA_SUCCESS {
            return Err(bad(format!(
                "cuTensorMapEncodeTiled failed ({}) for extents {dims:?}, box {box_dims:?}",
                cudarc::driver::DriverError(status)
            )));
        }
        // SAFETY: the driver filled the map.
        #[allow(unsafe_code)]
        Ok(TensorMap(unsafe { map.assume_init() }))
    }
}

//! Typed device buffers. The element type travels with the buffer so a launch
//! can check it against the kernel's declared parameters.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};

/// Element types of device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    U32,
}

impl DType {
    /// The CUDA C spelling, for messages and generated code.
    pub fn cuda_name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "__half",
            DType::BF16 => "__nv_bfloat16",
            DType::I32 => "int",
            DType::U32 => "unsigned int",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type device buffers can hold (sealed: f32, f16, bf16, i32, u32).
pub trait Element:
    sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + Default + std::fmt::Debug + Unpin + 'static
{
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, f16 => F16, bf16 => BF16, i32 => I32, u32 => U32);

/// Device memory holding `len` elements of `T`, freed on drop. Made by
/// [`Stream::alloc_zeros`](crate::Stream::alloc_zeros) and
/// [`Stream::upload`](crate::Stream::upload).
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
}

impl<T: Element> DeviceBuffer<T> {
    pub(crate) fn new(slice: CudaSlice<T>) -> Self {
        DeviceBuffer { slice }
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// The ordinal of the device the memory lives on.
    pub fn ordinal(&self) -> usize {
        self.slice.ordinal()
    }

    pub(crate) fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

//! Opening a CUDA device. cudarc panics when it touches a driver that is not
//! there, so every path into the driver goes through [`driver_present`] first
//! and reports [`RuntimeError::NoDriver`] instead.

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, cudaError_enum};
use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Result, RuntimeError};
use crate::stream::Stream;

/// Whether the CUDA driver library (libcuda) can be loaded. Checked once.
#[allow(unsafe_code)]
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver's library names; no driver call.
    *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

fn require_driver() -> Result<()> {
    if driver_present() {
        Ok(())
    } else {
        Err(RuntimeError::NoDriver {
            detail: "libcuda.so could not be loaded".into(),
        })
    }
}

/// The CUDA driver's version as (major, minor), e.g. (13, 0): part of
/// tuning-cache keys, since a driver update can change what is fastest.
#[allow(unsafe_code)]
pub fn driver_version() -> Result<(u32, u32)> {
    require_driver()?;
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the driver library is present (checked above); the call only
    // writes the version through the valid pointer it is given, and needs
    // no cuInit.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if status != cudaError_enum::CUDA_SUCCESS {
        return Err(RuntimeError::NoDriver {
            detail: format!("cuDriverGetVersion failed: {status:?}"),
        });
    }
    let v = u32::try_from(v).unwrap_or(0);
    Ok((v / 1000, (v % 1000) / 10))
}

/// What the compiler and launcher need to know about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor), e.g. (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    /// The NVRTC `--gpu-architecture` to compile for; see [`arch_for`].
    pub arch: String,
    pub sm_count: u32,
    /// Shared memory a block gets without opting in (48 KiB on every GPU we target).
    pub max_shared_per_block: u32,
    /// Shared memory a block may use after opting in (227 KiB on H100).
    pub max_shared_per_block_optin: u32,
    /// Shared memory of one multiprocessor, shared by its resident blocks
    /// (228 KiB on H100; each block also reserves 1 KiB of it).
    pub max_shared_per_sm: u32,
    pub total_memory: usize,
}

/// The NVRTC architecture for a compute capability: `sm_90a` for 9.0 (the
/// `a` unlocks wgmma/TMA, which only exist there), `sm_XY` otherwise.
pub fn arch_for(major: u32, minor: u32) -> String {
    if (major, minor) == (9, 0) {
        "sm_90a".into()
    } else {
        format!("sm_{major}{minor}")
    }
}

/// An open device: its primary context, default stream and properties.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
}

impl Device {
    /// Number of CUDA devices; 0 when the driver is present but sees no GPU.
    pub fn count() -> Result<usize> {
        require_driver()?;
        match CudaContext::device_count() {
            Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
            Err(e) if e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE => Ok(0),
            Err(e) => Err(RuntimeError::driver("cuInit/cuDeviceGetCount")(e)),
        }
    }

    /// Opens device `ordinal` (its primary context).
    pub fn open(ordinal: usize) -> Result<Device> {
        let count = Device::count()?;
        if ordinal >= count {
            return Err(RuntimeError::NoDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(RuntimeError::driver("cuDevicePrimaryCtxRetain"))?;
        let attr = |a: CUdevice_attribute| -> Result<u32> {
            let v = ctx
                .attribute(a)
                .map_err(RuntimeError::driver("cuDeviceGetAttribute"))?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        let (major, minor) = (
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let info = DeviceInfo {
            ordinal,
            name: ctx
                .name()
                .map_err(RuntimeError::driver("cuDeviceGetName"))?,
            compute_capability: (major, minor),
            arch: arch_for(major, minor),
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_shared_per_block: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            )?,
            max_shared_per_block_optin: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            max_shared_per_sm: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            )?,
            total_memory: ctx
                .total_mem()
                .map_err(RuntimeError::driver("cuDeviceTotalMem"))?,
        };
        let stream = ctx.default_stream();
        Ok(Device {
            inner: Arc::new(Inner { ctx, stream, info }),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    pub fn ordinal(&self) -> usize {
        self.inner.info.ordinal
    }

    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    pub fn compute_capability(&self) -> (u32, u32) {
        self.inner.info.compute_capability
    }

    /// The NVRTC architecture to compile for (`sm_90a`, `sm_80`, …).
    pub fn arch(&self) -> &str {
        &self.inner.info.arch
    }

    pub fn sm_count(&self) -> u32 {
        self.inner.info.sm_count
    }

    /// Largest dynamic + static shared memory per block after opting in.
    pub fn max_dynamic_shared_memory(&self) -> u32 {
        self.inner.info.max_shared_per_block_optin
    }

    /// Shared memory of one multiprocessor (what its resident blocks share).
    pub fn shared_memory_per_sm(&self) -> u32 {
        self.inner.info.max_shared_per_sm
    }

    /// The context's default (legacy) stream.
    pub fn stream(&self) -> Stream {
        Stream::new(self.inner.stream.clone(), self.ordinal())
    }

    /// A new stream of its own.
    pub fn new_stream(&self) -> Result<Stream> {
        let s = self
            .inner
            .ctx
            .new_stream()
            .map_err(RuntimeError::driver("cuStreamCreate"))?;
        Ok(Stream::new(s, self.ordinal()))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .ctx
            .synchronize()
            .map_err(RuntimeError::driver("cuCtxSynchronize"))
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_strings() {
        assert_eq!(arch_for(9, 0), "sm_90a");
        assert_eq!(arch_for(8, 0), "sm_80");
        assert_eq!(arch_for(8, 6), "sm_86");
        assert_eq!(arch_for(8, 9), "sm_89");
        assert_eq!(arch_for(12, 0), "sm_120");
    }
}

//! Streams and the host↔device copies that run on them. Copies are ordered
//! with launches on the same stream; downloads wait for the stream.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::error::{Result, RuntimeError};
use crate::memory::{DeviceBuffer, Element};

/// A CUDA stream of one device. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
    ordinal: usize,
}

impl Stream {
    pub(crate) fn new(inner: Arc<CudaStream>, ordinal: usize) -> Stream {
        Stream { inner, ordinal }
    }

    pub(crate) fn cuda(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// The ordinal of the device the stream belongs to.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Blocks until everything queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .synchronize()
            .map_err(RuntimeError::driver("cuStreamSynchronize"))
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc_zeros<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let slice = if len == 0 {
            self.inner.null()
        } else {
            self.inner.alloc_zeros(len)
        }
        .map_err(RuntimeError::driver("cuMemAlloc"))?;
        Ok(DeviceBuffer::new(slice))
    }

    /// A buffer of `len` elements whose contents are unspecified: for
    /// workspaces that kernels overwrite completely before reading them,
    /// where [`alloc_zeros`](Self::alloc_zeros)'s fill would be wasted
    /// bandwidth (the recurrent backward's per-chunk states are gigabytes).
    /// Downloading it before a kernel wrote it gives arbitrary values.
    #[allow(unsafe_code)]
    pub fn alloc_scratch<T: Element>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        if len == 0 {
            return self.alloc_zeros(0);
        }
        // SAFETY: the memory is only ever read by kernels and by copies to
        // the host; every element type (f32, f16, bf16, i32, u32) is valid
        // for any bit pattern, so unspecified contents are not undefined
        // behaviour on either side.
        let slice =
            unsafe { self.inner.alloc::<T>(len) }.map_err(RuntimeError::driver("cuMemAlloc"))?;
        Ok(DeviceBuffer::new(slice))
    }

    /// A new buffer holding a copy of `host`.
    pub fn upload<T: Element>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        if host.is_empty() {
            return self.alloc_zeros(0);
        }
        let slice = self
            .inner
            .clone_htod(host)
            .map_err(RuntimeError::driver("cuMemcpyHtoD"))?;
        Ok(DeviceBuffer::new(slice))
    }

    /// Overwrites `buf` with `host`, which must have the same length.
    pub fn copy_to_device<T: Element>(&self, host: &[T], buf: &mut DeviceBuffer<T>) -> Result<()> {
        self.check(buf)?;
        if host.len() != buf.len() {
            return Err(RuntimeError::Length {
                expected: buf.len(),
                got: host.len(),
            });
        }
        if host.is_empty() {
            return Ok(());
        }
        self.inner
            .memcpy_htod(host, buf.slice_mut())
            .map_err(RuntimeError::driver("cuMemcpyHtoD"))
    }

    /// Copies `buf` back to the host, after all work queued on the stream.
    pub fn download<T: Element>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>> {
        self.check(buf)?;
        if buf.is_empty() {
            return Ok(Vec::new());
        }
        let host = self
            .inner
            .clone_dtoh(buf.slice())
            .map_err(RuntimeError::driver("cuMemcpyDtoH"))?;
        self.synchronize()?;
        Ok(host)
    }

    fn check<T: Element>(&self, buf: &DeviceBuffer<T>) -> Result<()> {
        if buf.ordinal() == self.ordinal {
            Ok(())
        } else {
            Err(RuntimeError::Invalid(format!(
                "a buffer of device {} used on a stream of device {}",
                buf.ordinal(),
                self.ordinal
            )))
        }
    }
}

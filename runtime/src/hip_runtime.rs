//! AMD GPUs through the HIP runtime (`hip-sys`, cargo feature `hip`): device
//! discovery, code objects loaded with `hipModuleLoadData`, launches, device
//! buffers and event timing. Builds against Debian's `libamdhip64-dev`; with
//! no AMD GPU every entry point returns [`RuntimeError::NoAmdGpu`].
//!
//! No AMD GPU exists on the machines this project is developed and tested
//! on: this module is built in CI and exercised up to device discovery; the
//! kernels it would launch are checked by compilation and emulation
//! (ARCHITECTURE.md).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_void};
use std::marker::PhantomData;

use hip_sys::hiprt::{
    hipDeviceProp_t, hipError_t, hipEvent_t, hipFunction_t, hipMemcpyKind, hipModule_t,
};

use crate::error::{Result, RuntimeError};

fn check(call: &'static str, e: hipError_t) -> Result<()> {
    if e == hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: hipGetErrorString returns a static NUL-terminated string for
    // every error code.
    let text = unsafe { CStr::from_ptr(hip_sys::hiprt::hipGetErrorString(e)) }
        .to_string_lossy()
        .into_owned();
    Err(RuntimeError::Hip { call, detail: text })
}

/// An AMD GPU seen by the HIP runtime.
#[derive(Debug, Clone)]
pub struct HipDevice {
    pub ordinal: i32,
    /// The marketing name (`AMD Instinct MI250X`).
    pub name: String,
    /// The architecture with its features (`gfx90a:sramecc+:xnack-`).
    pub arch: String,
    pub compute_units: u32,
}

impl HipDevice {
    /// The AMD GPUs present; `Err(NoAmdGpu)` when there are none (or no
    /// driver), never a panic.
    pub fn all() -> Result<Vec<HipDevice>> {
        let mut count = 0;
        // SAFETY: hipGetDeviceCount writes one int.
        let e = unsafe { hip_sys::hiprt::hipGetDeviceCount(&mut count) };
        if e != hipError_t::hipSuccess || count <= 0 {
            return Err(RuntimeError::NoAmdGpu);
        }
        (0..count).map(HipDevice::at).collect()
    }

    fn at(ordinal: i32) -> Result<HipDevice> {
        let mut props: hipDeviceProp_t = Default::default();
        // SAFETY: props is a properly sized, writable hipDeviceProp_t.
        check("hipGetDeviceProperties", unsafe {
            hip_sys::hiprt::hipGetDeviceProperties(&mut props, ordinal)
        })?;
        let text = |chars: &[std::ffi::c_char]| {
            let bytes: Vec<u8> = chars
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Ok(HipDevice {
            ordinal,
            name: text(&props.name),
            arch: text(&props.gcnArchName),
            compute_units: props.multiProcessorCount.max(0) as u32,
        })
    }

    /// Makes this the current device of the calling thread.
    pub fn select(&self) -> Result<()> {
        // SAFETY: plain call with a device ordinal the runtime reported.
        check("hipSetDevice", unsafe {
            hip_sys::hiprt::hipSetDevice(self.ordinal)
        })
    }
}

/// A loaded code object.
#[derive(Debug)]
pub struct HipModule {
    raw: hipModule_t,
}

impl HipModule {
    /// Loads a code object (the ELF `hip_compile` writes) on the current device.
    pub fn load(code_object: &[u8]) -> Result<HipModule> {
        if code_object.len() < 4 || &code_object[..4] != b"\x7fELF" {
            return Err(RuntimeError::Invalid(
                "not an AMDGPU code object (expected an ELF file)".into(),
            ));
        }
        let mut raw: hipModule_t = std::ptr::null_mut();
        // SAFETY: the image is a complete ELF that outlives the call (HIP
        // copies it); raw receives the module handle.
        check("hipModuleLoadData", unsafe {
            hip_sys::hiprt::hipModuleLoadData(&mut raw, code_object.as_ptr().cast())
        })?;
        Ok(HipModule { raw })
    }

    /// The kernel `name` (an `extern "C"` entry).
    pub fn kernel(&self, name: &str) -> Result<HipKernel<'_>> {
        let c =
            CString::new(name).map_err(|_| RuntimeError::KernelNotFound { name: name.into() })?;
        let mut f: hipFunction_t = std::ptr::null_mut();
        // SAFETY: the module is loaded; c is NUL-terminated.
        let e = unsafe { hip_sys::hiprt::hipModuleGetFunction(&mut f, self.raw, c.as_ptr()) };
        if e != hipError_t::hipSuccess {
            return Err(RuntimeError::KernelNotFound { name: name.into() });
        }
        Ok(HipKernel {
            raw: f,
            name: name.into(),
            _module: PhantomData,
        })
    }
}

impl Drop for HipModule {
    fn drop(&mut self) {
        // SAFETY: the handle came from hipModuleLoadData and is unloaded once.
        let _ = unsafe { hip_sys::hiprt::hipModuleUnload(self.raw) };
    }
}

/// A kernel argument by value.
#[derive(Debug, Clone, Copy)]
pub enum HipParam {
    /// A device pointer.
    Ptr(u64),
    I32(i32),
    F32(f32),
}

/// A kernel of a loaded module.
#[derive(Debug)]
pub struct HipKernel<'m> {
    raw: hipFunction_t,
    name: String,
    _module: PhantomData<&'m HipModule>,
}

impl HipKernel<'_> {
    /// Launches on the default stream with `grid` workgroups of `block`
    /// work-items and the parameters in order.
    pub fn launch(
        &self,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &[HipParam],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || block.0 == 0 {
            return Err(RuntimeError::LaunchConfig {
                kernel: self.name.clone(),
                detail: format!("empty grid {grid:?} or block {block:?}"),
            });
        }
        let mut storage: Vec<[u8; 8]> = params
            .iter()
            .map(|p| match *p {
                HipParam::Ptr(x) => x.to_ne_bytes(),
                HipParam::I32(x) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&x.to_ne_bytes());
                    b
                }
                HipParam::F32(x) => {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&x.to_ne_bytes());
                    b
                }
            })
            .collect();
        let mut ptrs: Vec<*mut c_void> =
            storage.iter_mut().map(|s| s.as_mut_ptr().cast()).collect();
        // SAFETY: one pointer per parameter, each to storage that lives until
        // the call returns (HIP copies the values at launch).
        check("hipModuleLaunchKernel", unsafe {
            hip_sys::hiprt::hipModuleLaunchKernel(
                self.raw,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                std::ptr::null_mut(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// Device memory of `len` elements of `T`.
#[derive(Debug)]
pub struct HipBuffer<T: Copy> {
    ptr: *mut c_void,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Copy> HipBuffer<T> {
    /// Allocates and fills from `host`.
    pub fn upload(host: &[T]) -> Result<HipBuffer<T>> {
        let bytes = std::mem::size_of_val(host);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: ptr receives a fresh allocation of `bytes`.
        check("hipMalloc", unsafe {
            hip_sys::hiprt::hipMalloc(&mut ptr, bytes.max(1))
        })?;
        let buf = HipBuffer {
            ptr,
            len: host.len(),
            _t: PhantomData,
        };
        // SAFETY: both regions are `bytes` long; the device one was just allocated.
        check("hipMemcpy", unsafe {
            hip_sys::hiprt::hipMemcpy(
                buf.ptr,
                host.as_ptr().cast(),
                bytes,
                hipMemcpyKind::hipMemcpyHostToDevice,
            )
        })?;
        Ok(buf)
    }

    /// Copies back to the host (synchronous).
    pub fn download(&self) -> Result<Vec<T>>
    where
        T: Default,
    {
        let mut host = vec![T::default(); self.len];
        // SAFETY: both regions are len elements of T.
        check("hipMemcpy", unsafe {
            hip_sys::hiprt::hipMemcpy(
                host.as_mut_ptr().cast(),
                self.ptr,
                std::mem::size_of_val(host.as_slice()),
                hipMemcpyKind::hipMemcpyDeviceToHost,
            )
        })?;
        Ok(host)
    }

    /// The device address, as a kernel parameter.
    pub fn param(&self) -> HipParam {
        HipParam::Ptr(self.ptr as u64)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Copy> Drop for HipBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from hipMalloc and is freed once.
        let _ = unsafe { hip_sys::hiprt::hipFree(self.ptr) };
    }
}

/// Milliseconds `work` takes on the default stream, from HIP events.
pub fn hip_time_ms(work: impl FnOnce() -> Result<()>) -> Result<f32> {
    let mut start: hipEvent_t = std::ptr::null_mut();
    let mut stop: hipEvent_t = std::ptr::null_mut();
    // SAFETY: the events are created, recorded, synchronised and destroyed here.
    unsafe {
        check("hipEventCreate", hip_sys::hiprt::hipEventCreate(&mut start))?;
        check("hipEventCreate", hip_sys::hiprt::hipEventCreate(&mut stop))?;
        check(
            "hipEventRecord",
            hip_sys::hiprt::hipEventRecord(start, std::ptr::null_mut()),
        )?;
    }
    let worked = work();
    let mut ms = 0.0f32;
    // SAFETY: as above.
    let timed = unsafe {
        check(
            "hipEventRecord",
            hip_sys::hiprt::hipEventRecord(stop, std::ptr::null_mut()),
        )
        .and_then(|()| {
            check(
                "hipEventSynchronize",
                hip_sys::hiprt::hipEventSynchronize(stop),
            )
        })
        .and_then(|()| {
            check(
                "hipEventElapsedTime",
                hip_sys::hiprt::hipEventElapsedTime(&mut ms, start, stop),
            )
        })
    };
    // SAFETY: both events were created above.
    unsafe {
        let _ = hip_sys::hiprt::hipEventDestroy(start);
        let _ = hip_sys::hiprt::hipEventDestroy(stop);
    }
    worked?;
    timed?;
    Ok(ms)
}

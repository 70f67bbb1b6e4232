//! Loading CUBINs and launching their kernels.
//!
//! A [`Kernel`] is looked up with its parameter list, and every launch checks
//! the arguments against it (count, scalar types, buffer element types,
//! device) and the configuration against the device (threads, shared memory),
//! so the usual mistakes are errors instead of corrupt memory. What cannot be
//! checked is the kernel's own indexing: it must stay inside the buffers it
//! is given for the sizes it is given — aec's generated kernels do.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::sys::{CUfunction_attribute, cudaError_enum};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg,
};
use half::{bf16, f16};

use crate::device::Device;
use crate::error::{Result, RuntimeError};
use crate::memory::{DType, DeviceBuffer};
use crate::stream::Stream;
use crate::tensor_map::TensorMap;

/// A loaded module (one CUBIN) on one device.
#[derive(Debug, Clone)]
pub struct Module {
    inner: Arc<CudaModule>,
    device: Device,
}

impl Module {
    /// Loads a CUBIN (from [`compile`](crate::compile)) onto `device`.
    pub fn load(device: &Device, cubin: &[u8]) -> Result<Module> {
        if cubin.is_empty() {
            return Err(RuntimeError::Invalid(
                "empty CUBIN: compile for a real architecture (sm_XY), not compute_XY".into(),
            ));
        }
        let image = cudarc::nvrtc::Ptx::from_binary(cubin.to_vec());
        let inner = device.context().load_module(image).map_err(|e| {
            if e.0 == cudaError_enum::CUDA_ERROR_NO_BINARY_FOR_GPU
                || e.0 == cudaError_enum::CUDA_ERROR_INVALID_IMAGE
            {
                RuntimeError::Invalid(format!(
                    "the CUBIN cannot run on {} ({}, {e}): compile it with \
                     CompileOptions::new(device.arch())",
                    device.name(),
                    device.arch()
                ))
            } else {
                RuntimeError::driver("cuModuleLoadData")(e)
            }
        })?;
        Ok(Module {
            inner,
            device: device.clone(),
        })
    }

    /// The kernel `name` (an `extern "C"` name), taking parameters `params`
    /// in order.
    pub fn kernel(&self, name: &str, params: &[Param]) -> Result<Kernel> {
        if name.contains('\0') {
            return Err(RuntimeError::Invalid(format!(
                "kernel name {name:?} contains a NUL byte"
            )));
        }
        let func = self.inner.load_function(name).map_err(|e| {
            if e.0 == cudaError_enum::CUDA_ERROR_NOT_FOUND {
                RuntimeError::KernelNotFound { name: name.into() }
            } else {
                RuntimeError::driver("cuModuleGetFunction")(e)
            }
        })?;
        let attr = |a: CUfunction_attribute| -> Result<u32> {
            let v = func
                .get_attribute(a)
                .map_err(RuntimeError::driver("cuFuncGetAttribute"))?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        Ok(Kernel {
            name: name.into(),
            params: params.to_vec(),
            ordinal: self.device.ordinal(),
            optin_limit: self.device.max_dynamic_shared_memory(),
            static_smem: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_threads: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            dynamic_allowed: Mutex::new(attr(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )?),
            resident: Mutex::new(None),
            ctx: self.device.context().clone(),
            func,
        })
    }
}

/// A kernel parameter, as declared in the CUDA source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Param {
    /// `const T*` the kernel only reads.
    In(DType),
    /// `T*` the kernel writes (pass the buffer as `&mut`).
    Out(DType),
    I32,
    U32,
    F32,
    U64,
    /// A `CUtensorMap` passed by value ([`TensorMap`]).
    TensorMap,
}

impl std::fmt::Display for Param {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Param::In(d) => write!(f, "const {d}*"),
            Param::Out(d) => write!(f, "{d}*"),
            Param::I32 => f.write_str("i32"),
            Param::U32 => f.write_str("u32"),
            Param::F32 => f.write_str("f32"),
            Param::U64 => f.write_str("u64"),
            Param::TensorMap => f.write_str("tensor map"),
        }
    }
}

/// One launch argument: a buffer (`&buf` to read, `&mut buf` to write), a
/// scalar (`i32`, `u32`, `f32`, `u64`) or a tensor map (`&map`). Made with
/// `Arg::from`/`.into()` or the [`args!`](crate::args) macro.
#[derive(Debug)]
pub struct Arg<'a>(ArgKind<'a>);

#[derive(Debug)]
enum ArgKind<'a> {
    In(BufRef<'a>),
    Out(BufMut<'a>),
    I32(i32),
    U32(u32),
    F32(f32),
    U64(u64),
    TensorMap(&'a TensorMap),
}

impl<'a> From<&'a TensorMap> for Arg<'a> {
    fn from(m: &'a TensorMap) -> Self {
        Arg(ArgKind::TensorMap(m))
    }
}

macro_rules! buffer_args {
    ($($t:ty => $v:ident),* $(,)?) => {
        #[derive(Debug)]
        enum BufRef<'a> { $($v(&'a CudaSlice<$t>)),* }
        #[derive(Debug)]
        enum BufMut<'a> { $($v(&'a mut CudaSlice<$t>)),* }

        impl BufRef<'_> {
            fn dtype(&self) -> DType {
                match self { $(BufRef::$v(_) => DType::$v),* }
            }
            fn ordinal(&self) -> usize {
                match self { $(BufRef::$v(s) => s.ordinal()),* }
            }
        }
        impl BufMut<'_> {
            fn dtype(&self) -> DType {
                match self { $(BufMut::$v(_) => DType::$v),* }
            }
            fn ordinal(&self) -> usize {
                match self { $(BufMut::$v(s) => s.ordinal()),* }
            }
        }
        $(
            impl<'a> From<&'a DeviceBuffer<$t>> for Arg<'a> {
                fn from(b: &'a DeviceBuffer<$t>) -> Self {
                    Arg(ArgKind::In(BufRef::$v(b.slice())))
                }
            }
            impl<'a> From<&'a mut DeviceBuffer<$t>> for Arg<'a> {
                fn from(b: &'a mut DeviceBuffer<$t>) -> Self {
                    Arg(ArgKind::Out(BufMut::$v(b.slice_mut())))
                }
            }
        )*

        /// Pushes one argument; the references stay valid until `builder` is dropped.
        fn push<'a>(builder: &mut cudarc::driver::LaunchArgs<'a>, arg: &'a mut ArgKind<'_>) {
            match arg {
                $(ArgKind::In(BufRef::$v(s)) => { builder.arg(&**s); })*
                $(ArgKind::Out(BufMut::$v(s)) => { builder.arg(&mut **s); })*
                ArgKind::I32(v) => { builder.arg(&*v); }
                ArgKind::U32(v) => { builder.arg(&*v); }
                ArgKind::F32(v) => { builder.arg(&*v); }
                ArgKind::U64(v) => { builder.arg(&*v); }
                ArgKind::TensorMap(m) => { builder.arg(&**m); }
            }
        }
    };
}
buffer_args!(f32 => F32, f16 => F16, bf16 => BF16, i32 => I32, u32 => U32);

macro_rules! scalar_args {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Arg<'_> {
            fn from(v: $t) -> Self {
                Arg(ArgKind::$v(v))
            }
        }
    )*};
}
scalar_args!(i32 => I32, u32 => U32, f32 => F32, u64 => U64);

impl Arg<'_> {
    /// Whether this argument may be passed for `param`. A written buffer
    /// (`&mut`) may be passed for a read-only parameter, not the reverse.
    fn fits(&self, param: Param) -> bool {
        match (&self.0, param) {
            (ArgKind::In(b), Param::In(d)) => b.dtype() == d,
            (ArgKind::Out(b), Param::In(d) | Param::Out(d)) => b.dtype() == d,
            (ArgKind::I32(_), Param::I32)
            | (ArgKind::U32(_), Param::U32)
            | (ArgKind::F32(_), Param::F32)
            | (ArgKind::U64(_), Param::U64)
            | (ArgKind::TensorMap(_), Param::TensorMap) => true,
            _ => false,
        }
    }

    fn ordinal(&self) -> Option<usize> {
        match &self.0 {
            ArgKind::In(b) => Some(b.ordinal()),
            ArgKind::Out(b) => Some(b.ordinal()),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match &self.0 {
            ArgKind::In(b) => format!("&buffer<{}>", b.dtype()),
            ArgKind::Out(b) => format!("&mut buffer<{}>", b.dtype()),
            ArgKind::I32(_) => "i32".into(),
            ArgKind::U32(_) => "u32".into(),
            ArgKind::F32(_) => "f32".into(),
            ArgKind::U64(_) => "u64".into(),
            ArgKind::TensorMap(_) => "&tensor map".into(),
        }
    }
}

/// Builds `[Arg; N]` from buffers (`&b`, `&mut b`) and scalars:
/// `kernel.launch(&stream, grid, block, smem, &mut args![&q, &mut o, n, 0.5f32])`.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::Arg::from($a)),*] };
}

/// A kernel of a loaded module, with its declared parameters.
#[derive(Debug)]
pub struct Kernel {
    func: CudaFunction,
    name: String,
    params: Vec<Param>,
    ordinal: usize,
    optin_limit: u32,
    static_smem: u32,
    max_threads: u32,
    /// The kernel's current MAX_DYNAMIC_SHARED_SIZE_BYTES.
    dynamic_allowed: Mutex<u32>,
    /// The last occupancy query: threads, dynamic shared memory, blocks.
    resident: Mutex<Option<(u32, u32, u32)>>,
    ctx: Arc<CudaContext>,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Static shared memory the kernel declares.
    pub fn static_shared_bytes(&self) -> u32 {
        self.static_smem
    }

    /// The most dynamic shared memory a launch may ask for.
    pub fn max_dynamic_shared_bytes(&self) -> u32 {
        self.optin_limit.saturating_sub(self.static_smem)
    }

    /// Blocks of `threads` threads with `dynamic_smem` bytes of dynamic
    /// shared memory that one multiprocessor holds at once, by the driver's
    /// occupancy calculator (registers, threads and shared memory). The
    /// kernel is opted in to `dynamic_smem` first, as a launch would be.
    /// The answer is kept: decoding calls ask it every launch.
    pub fn resident_blocks(&self, threads: u32, dynamic_smem: u32) -> Result<u32> {
        let mut last = self.resident.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((t, s, n)) = *last
            && (t, s) == (threads, dynamic_smem)
        {
            return Ok(n);
        }
        self.opt_in_shared(dynamic_smem)?;
        self.ctx
            .bind_to_thread()
            .map_err(RuntimeError::driver("cuCtxSetCurrent"))?;
        let n = self
            .func
            .occupancy_max_active_blocks_per_multiprocessor(threads, dynamic_smem as usize, None)
            .map_err(RuntimeError::driver(
                "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
            ))?;
        *last = Some((threads, dynamic_smem, n));
        Ok(n)
    }

    /// Queues the kernel on `stream`. Above the default 48 KiB of dynamic
    /// shared memory the kernel is opted in to `dynamic_smem` bytes first.
    #[allow(unsafe_code)]
    pub fn launch(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        dynamic_smem: u32,
        args: &mut [Arg<'_>],
    ) -> Result<()> {
        self.check_args(stream, args)?;
        self.check_config(grid, block)?;
        self.opt_in_shared(dynamic_smem)?;
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: dynamic_smem,
        };
        let mut builder = stream.cuda().launch_builder(&self.func);
        for arg in args.iter_mut() {
            push(&mut builder, &mut arg.0);
        }
        // SAFETY: the arguments match the declared parameters in number and
        // type (check_args), buffers live on this device and are borrowed
        // (written ones mutably) until the builder is dropped, and cudarc
        // orders the launch after earlier uses of the buffers. The kernel's
        // indexing is the remaining contract (see the module docs).
        unsafe { builder.launch(cfg) }.map_err(RuntimeError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    fn check_args(&self, stream: &Stream, args: &[Arg<'_>]) -> Result<()> {
        let bad = |detail: String| RuntimeError::Arguments {
            kernel: self.name.clone(),
            detail,
        };
        if stream.ordinal() != self.ordinal {
            return Err(bad(format!(
                "the kernel is loaded on device {} but the stream is of device {}",
                self.ordinal,
                stream.ordinal()
            )));
        }
        if args.len() != self.params.len() {
            return Err(bad(format!(
                "{} arguments given, the kernel takes {} ({})",
                args.len(),
                self.params.len(),
                list(&self.params)
            )));
        }
        for (i, (arg, &param)) in args.iter().zip(&self.params).enumerate() {
            if !arg.fits(param) {
                let hint = if matches!((&arg.0, param), (ArgKind::In(b), Param::Out(d)) if b.dtype() == d)
                {
                    " (the kernel writes it: pass `&mut`)"
                } else {
                    ""
                };
                return Err(bad(format!(
                    "argument {i} is {} but the kernel takes {param}{hint}",
                    arg.describe()
                )));
            }
            if let Some(o) = arg.ordinal().filter(|&o| o != self.ordinal) {
                return Err(bad(format!(
                    "argument {i} lives on device {o}, the kernel on device {}",
                    self.ordinal
                )));
            }
        }
        Ok(())
    }

    fn check_config(&self, grid: (u32, u32, u32), block: (u32, u32, u32)) -> Result<()> {
        let bad = |detail: String| RuntimeError::LaunchConfig {
            kernel: self.name.clone(),
            detail,
        };
        if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
            return Err(bad(format!(
                "grid {grid:?} and block {block:?} must have no zero dimension"
            )));
        }
        let threads = u64::from(block.0) * u64::from(block.1) * u64::from(block.2);
        if threads > u64::from(self.max_threads) {
            return Err(bad(format!(
                "block {block:?} has {threads} threads; this kernel allows at most {}",
                self.max_threads
            )));
        }
        Ok(())
    }

    fn opt_in_shared(&self, dynamic_smem: u32) -> Result<()> {
        let mut allowed = self
            .dynamic_allowed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if dynamic_smem <= *allowed {
            return Ok(());
        }
        if dynamic_smem > self.max_dynamic_shared_bytes() {
            return Err(RuntimeError::SharedMemory {
                kernel: self.name.clone(),
                requested: dynamic_smem,
                limit: self.max_dynamic_shared_bytes(),
                static_bytes: self.static_smem,
            });
        }
        let value = i32::try_from(dynamic_smem).unwrap_or(i32::MAX);
        self.ctx
            .bind_to_thread()
            .map_err(RuntimeError::driver("cuCtxSetCurrent"))?;
        self.func
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
            .map_err(RuntimeError::driver("cuFuncSetAttribute"))?;
        *allowed = dynamic_smem;
        Ok(())
    }
}

fn list(params: &[Param]) -> String {
    params
        .iter()
        .map(Param::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

//! Decoding with a recurrent variant: [`RecurrentDecoder`] applies a few
//! steps (usually one per generated token) to a state kept on the GPU,
//! updating it in place.
//!
//! ```no_run
//! use aec::prelude::*;
//!
//! attention! {
//!     /// RetNet retention, recurrent form.
//!     pub struct Retention: recurrent {
//!         q: [B, H, S, Dk], k: [B, H, S, Dk], v: [B, H, S, Dv];
//!         modify_q = |q| q * rsqrt(Dk);
//!         decay = |b, h, t| 1.0 - exp2(-5.0 - h);
//!     }
//! }
//!
//! fn main() -> Result<(), aec::Error> {
//!     let device = Device::open(0)?;
//!     let stream = device.stream();
//!     let dims = RecurrentDims::new(128, 128); // Dk, Dv
//!     let decoder = Retention::compile_recurrent_decoder(&device, dims, &KernelOptions::default())?;
//!     // The state after a prompt (from RecurrentKernels::forward's final_state), or zeros.
//!     let mut state = stream.alloc_zeros::<f32>(4 * 8 * 128 * 128)?; // [B, H, Dk, Dv]
//!     let shape = RecurrentShape::new(4, 8, 1); // B, H, one step
//!     let q = stream.upload(&vec![bf16::from_f32(0.1); 4 * 8 * 128])?; // [B, H, 1, Dk]
//!     let k = stream.upload(&vec![bf16::from_f32(0.2); 4 * 8 * 128])?; // [B, H, 1, Dk]
//!     let v = stream.upload(&vec![bf16::from_f32(0.3); 4 * 8 * 128])?; // [B, H, 1, Dv]
//!     let o = decoder.step(&stream, &q, &k, &v, &[], shape, &mut state, None)?;
//!     let o: Vec<bf16> = stream.download(&o)?; // [B, H, 1, Dv]
//!     println!("{} outputs", o.len());
//!     Ok(())
//! }
//! ```

use super::recurrent::{RecurrentDims, RecurrentShape, check_recurrent_shapes};
use super::{
    Error, KernelElement, KernelOptions, check_devices, check_elem, compile_and_load, dtype_of,
    loading_error,
};
use crate::compiler::{ArgKind, CompileError, Elem, RecurrentStepSource, recurrent_step};
use crate::frontend::ir::Axis;
use crate::frontend::{self, Pattern};
use crate::runtime::{Arg, DType, Device, DeviceBuffer, Kernel, Module, Param, Stream};

/// Generates the step kernel of `variant` for `dims` without compiling it:
/// the CUDA source and its launch facts (needs no GPU; the first step of
/// [`RecurrentDecoder::compile`], with the same errors).
pub fn recurrent_step_source(
    variant: &frontend::Variant,
    dims: RecurrentDims,
    options: &KernelOptions,
) -> Result<RecurrentStepSource, Error> {
    if variant.pattern != Pattern::Recurrent {
        return Err(Error::Pattern(format!(
            "`{}` is a parallel variant: RecurrentDecoder runs recurrent variants only; decode \
             a parallel variant with ParallelKernels::forward (Sq = 1)",
            variant.name
        )));
    }
    recurrent_step(variant, dims.dk, dims.dv, options.elem).map_err(|source| Error::Compile {
        variant: variant.name.clone(),
        kernel: "recurrent step",
        source,
    })
}

/// The compiled step kernel of one recurrent variant for one pair of head
/// dims on one device. See [`step`](Self::step).
#[derive(Debug)]
pub struct RecurrentDecoder {
    variant: frontend::Variant,
    dims: RecurrentDims,
    source: RecurrentStepSource,
    device: Device,
    kernel: Kernel,
    _module: Module,
}

impl RecurrentDecoder {
    /// Generates the step kernel of `variant` for `dims` (Dk a multiple of 4
    /// up to 256, Dv a multiple of 32 up to 512; decays per key dimension
    /// are taken), compiles it with NVRTC for `device.arch()` through the
    /// kernel cache and loads it.
    ///
    /// Errors: a parallel variant ([`Error::Pattern`]); head dims the kernel
    /// does not take or that contradict the variant's fixed sizes
    /// ([`Error::Compile`]); NVRTC or the driver failing
    /// ([`Error::Runtime`]).
    pub fn compile(
        variant: &frontend::Variant,
        device: &Device,
        dims: RecurrentDims,
        options: &KernelOptions,
    ) -> Result<RecurrentDecoder, Error> {
        let source = recurrent_step_source(variant, dims, options)?;
        let what = format!(
            "`{}` (the recurrent step kernel of `{}`)",
            source.name, variant.name
        );
        let module = compile_and_load(device, &source.source, options, &what)?;
        let elem = dtype_of(source.elem);
        let declared = |name: &String| variant.customs.iter().any(|c| &c.name == name);
        let params = source
            .args
            .iter()
            .map(|a| match a {
                ArgKind::Tensor("q" | "k" | "v") => Ok(Param::In(elem)),
                ArgKind::Tensor("o") => Ok(Param::Out(elem)),
                ArgKind::Custom(name) if declared(name) => Ok(Param::In(DType::F32)),
                ArgKind::State("state" | "norm") => Ok(Param::Out(DType::F32)),
                ArgKind::Size(Axis::B | Axis::H | Axis::S) => Ok(Param::I32),
                other => Err(unknown_argument(&variant.name, other)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let kernel = module
            .kernel(&source.name, &params)
            .map_err(loading_error(device, &what))?;
        Ok(RecurrentDecoder {
            variant: variant.clone(),
            dims,
            source,
            device: device.clone(),
            kernel,
            _module: module,
        })
    }

    /// The variant the kernel was generated from.
    pub fn variant(&self) -> &frontend::Variant {
        &self.variant
    }

    pub fn dims(&self) -> RecurrentDims {
        self.dims
    }

    /// The generated source and its launch facts.
    pub fn source(&self) -> &RecurrentStepSource {
        &self.source
    }

    /// The element type the kernel was compiled for.
    pub fn elem(&self) -> Elem {
        self.source.elem
    }

    /// Whether the variant has a normaliser: then [`step`](Self::step)
    /// needs the key sum.
    pub fn normalized(&self) -> bool {
        self.source.normalized
    }

    /// Checks, without touching the GPU, that tensors with the given element
    /// counts fit this kernel for `shape`: q, k, v and the custom inputs as
    /// in [`check_recurrent_shapes`], `state` (f32 `[B, H, Dk, Dv]`) and,
    /// exactly for variants with a normaliser, `normalizer` (f32
    /// `[B, H, Dk]`).
    pub fn check(
        &self,
        shape: RecurrentShape,
        tensors: &[(&str, usize)],
        state: usize,
        normalizer: Option<usize>,
    ) -> Result<(), Error> {
        check_recurrent_shapes(&self.variant, self.dims, shape, tensors, None, None)?;
        let (dk, dv) = (self.dims.dk as usize, self.dims.dv as usize);
        let Some(expected) = [shape.b, shape.h, dk, dv]
            .iter()
            .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        else {
            return Err(Error::Shape(format!(
                "the state would have [B, H, Dk, Dv] = [{}, {}, {dk}, {dv}] elements, more than \
                 this machine can address: split the batch",
                shape.b, shape.h
            )));
        };
        if state != expected {
            return Err(Error::Shape(format!(
                "tensor `state` has {state} elements, expected [B, H, Dk, Dv] = [{}, {}, {dk}, \
                 {dv}] = {expected} (f32)",
                shape.b, shape.h
            )));
        }
        match (normalizer, self.normalized()) {
            (None, true) => Err(Error::Shape(format!(
                "`{}` has a normaliser (`normalize`): pass its key sum, f32 [B, H, Dk] = [{}, \
                 {}, {dk}] (zeros before the first step)",
                self.variant.name, shape.b, shape.h
            ))),
            (Some(_), false) => Err(Error::Shape(format!(
                "`{}` has no normaliser (no `normalize`), so it takes no `normalizer`: pass None",
                self.variant.name
            ))),
            (Some(len), true) if len != shape.b * shape.h * dk => Err(Error::Shape(format!(
                "tensor `normalizer` has {len} elements, expected [B, H, Dk] = [{}, {}, {dk}] = \
                 {} (f32)",
                shape.b,
                shape.h,
                shape.b * shape.h * dk
            ))),
            _ => Ok(()),
        }
    }

    /// Runs `shape.s` steps (usually 1) on `stream`, queued, updating `state`
    /// (f32 `[B, H, Dk, Dv]`) and, for a variant with a normaliser,
    /// `normalizer` (f32 `[B, H, Dk]`) in place, and returns the output
    /// `[B, H, S, Dv]`.
    ///
    /// `q`, `k`: `[B, H, S, Dk]`, `v`: `[B, H, S, Dv]` in the kernel's element
    /// type; `customs`: every custom input by name, f32, in its declared axis
    /// order with `S` steps. Closures see the steps of this call as
    /// `t = 0 … S − 1`, as [`RecurrentKernels::forward`](super::RecurrentKernels::forward)
    /// does. Every check happens before anything is launched; a failing one
    /// returns [`Error::Shape`] naming the tensor.
    #[allow(clippy::too_many_arguments)]
    pub fn step<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: RecurrentShape,
        state: &mut DeviceBuffer<f32>,
        normalizer: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<DeviceBuffer<T>, Error> {
        let name = &self.variant.name;
        check_elem::<T>(name, self.elem(), "q, k and v")?;
        let buffers = [("q", q.ordinal()), ("k", k.ordinal()), ("v", v.ordinal())]
            .into_iter()
            .chain(customs.iter().map(|(n, b)| (*n, b.ordinal())))
            .chain([("state", state.ordinal())])
            .chain(normalizer.as_ref().map(|b| ("normalizer", b.ordinal())));
        check_devices(&self.device, name, stream, buffers)?;
        let lens: Vec<(&str, usize)> = [("q", q.len()), ("k", k.len()), ("v", v.len())]
            .into_iter()
            .chain(customs.iter().map(|(n, b)| (*n, b.len())))
            .collect();
        self.check(
            shape,
            &lens,
            state.len(),
            normalizer.as_ref().map(|b| b.len()),
        )?;
        let grid = self.source.grid_for(shape.b, shape.h).ok_or_else(|| {
            Error::Shape(format!(
                "the shape {shape} needs a grid for `{}` larger than CUDA launches: split the call",
                self.source.name
            ))
        })?;
        let runtime = |e| Error::Runtime {
            during: format!("launching `{}`", self.source.name),
            source: e,
        };
        let mut o = stream
            // Every step writes all of its outputs: no fill on the decode path.
            .alloc_scratch::<T>(shape.b * shape.h * shape.s * self.dims.dv as usize)
            .map_err(runtime)?;
        let size = |n: usize| Arg::from(i32::try_from(n).unwrap_or(i32::MAX));
        let mut state_slot = Some(state);
        let mut norm_slot = normalizer;
        let mut o_slot = Some(&mut o);
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(self.source.args.len());
        for a in &self.source.args {
            let twice = || unknown_argument(name, a);
            args.push(match a {
                ArgKind::Tensor("q") => T::arg(q),
                ArgKind::Tensor("k") => T::arg(k),
                ArgKind::Tensor("v") => T::arg(v),
                ArgKind::Tensor("o") => T::arg_mut(o_slot.take().ok_or_else(twice)?),
                ArgKind::Custom(c) => {
                    let buf = customs
                        .iter()
                        .find(|(n, _)| n == c)
                        .map(|(_, b)| *b)
                        .ok_or_else(|| Error::Shape(format!("missing custom input `{c}`")))?;
                    Arg::from(buf)
                }
                ArgKind::State("state") => Arg::from(state_slot.take().ok_or_else(twice)?),
                ArgKind::State("norm") => Arg::from(norm_slot.take().ok_or_else(twice)?),
                ArgKind::Size(Axis::B) => size(shape.b),
                ArgKind::Size(Axis::H) => size(shape.h),
                ArgKind::Size(Axis::S) => size(shape.s),
                other => return Err(unknown_argument(name, other)),
            });
        }
        self.kernel
            .launch(stream, grid, (self.source.threads, 1, 1), 0, &mut args)
            .map_err(runtime)?;
        Ok(o)
    }
}

/// An argument of the generated kernel this API does not bind (or binds
/// twice): the generator and the runtime disagree.
fn unknown_argument(variant: &str, arg: &ArgKind) -> Error {
    Error::Compile {
        variant: variant.into(),
        kernel: "recurrent step",
        source: CompileError(format!(
            "the generated kernel takes an argument this API does not bind ({arg:?}); this is a \
             bug in aec"
        )),
    }
}

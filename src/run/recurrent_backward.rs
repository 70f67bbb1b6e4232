//! The recurrent backward on the GPU: [`RecurrentKernels::backward`].
//!
//! Two modules: the states pass (the forward template writing the state
//! before each chunk) and the backward kernels, which all take one argument
//! list. Optional tensors (initial state, the final state's gradient, …) are
//! null pointers when absent, so each call declares its parameter list and
//! looks its kernels up in the loaded modules (a cheap driver call).

use super::recurrent::{ForwardInputs, RecurrentKernels, RecurrentShape, check_varlen};
use super::{Error, KernelElement, check_devices, check_elem, compile_and_load, dtype_of};
use crate::compiler::{ArgKind, CompileError, Isa, RecurrentBackwardSource, recurrent_backward};
use crate::frontend::ir::Axis;
use crate::runtime::{Arg, DType, DeviceBuffer, Module, Param, Stream, bf16};

/// The backward's loaded modules.
#[derive(Debug)]
pub(crate) struct BackwardModules {
    source: RecurrentBackwardSource,
    states: Module,
    kernels: Module,
}

/// What [`RecurrentKernels::backward`] returns: the gradients of every input
/// of the forward.
#[derive(Debug)]
pub struct RecurrentGradients<T: KernelElement = bf16> {
    /// `[B, H, S, Dk]`.
    pub dq: DeviceBuffer<T>,
    /// `[B, H, S, Dk]`.
    pub dk: DeviceBuffer<T>,
    /// `[B, H, S, Dv]`.
    pub dv: DeviceBuffer<T>,
    /// Every custom input's gradient (f32, shaped like the input), by name,
    /// in declaration order.
    pub customs: Vec<(String, DeviceBuffer<f32>)>,
    /// The initial state's gradient, f32 `[B, H, Dk, Dv]`, where an initial
    /// state was given.
    pub d_initial_state: Option<DeviceBuffer<f32>>,
    /// The initial normaliser's gradient, f32 `[B, H, Dk]`, where one was
    /// given.
    pub d_initial_normalizer: Option<DeviceBuffer<f32>>,
}

impl<T: KernelElement> RecurrentGradients<T> {
    /// The gradient of custom input `name`.
    pub fn custom(&self, name: &str) -> Option<&DeviceBuffer<f32>> {
        self.customs.iter().find(|(n, _)| n == name).map(|(_, b)| b)
    }
}

/// The tensors a backward call passes, by argument name.
enum Slot<'a, T: KernelElement> {
    Elem(&'a DeviceBuffer<T>),
    ElemOut(&'a mut DeviceBuffer<T>),
    F32(&'a DeviceBuffer<f32>),
    F32Out(&'a mut DeviceBuffer<f32>),
    Null,
}

/// The buffers of one backward call.
#[derive(Clone, Copy)]
struct BackwardInputs<'a, T: KernelElement> {
    /// The forward's inputs, which the states pass reruns.
    forward: ForwardInputs<'a, T>,
    d_o: &'a DeviceBuffer<T>,
    d_final_state: Option<&'a DeviceBuffer<f32>>,
    d_final_normalizer: Option<&'a DeviceBuffer<f32>>,
}

/// How a backward call's sequences lie in its inputs.
struct Layout<'a> {
    /// The inputs' (B, H, S): the sizes the kernels take.
    shape: RecurrentShape,
    /// Sequences, each with its own state: the grid's z.
    sequences: usize,
    /// The longest sequence's steps: the per-chunk grids' extent.
    max_len: usize,
    /// (sequence, head, chunk) triples: the per-chunk workspaces' rows.
    chunk_units: usize,
    /// A packed batch's boundaries and chunk offsets (`N + 1` each), or none.
    cu: Option<&'a DeviceBuffer<i32>>,
}

/// Sizes B, H, S as kernel arguments (bounded by i32::MAX by the checks).
fn size_arg(shape: RecurrentShape, axis: Axis) -> Arg<'static> {
    let n = shape.size(axis).unwrap_or(0);
    Arg::from(i32::try_from(n).unwrap_or(i32::MAX))
}

/// Parameters and arguments for one argument list from the named slots.
fn bind<'a, T: KernelElement>(
    variant: &str,
    args: &[ArgKind],
    slots: &mut Vec<(String, Slot<'a, T>)>,
    shape: RecurrentShape,
    cu_seqlens: Option<&'a DeviceBuffer<i32>>,
) -> Result<(Vec<Param>, Vec<Arg<'a>>), Error> {
    let elem = dtype_of(T::ELEM);
    let bug = |what: String| Error::Compile {
        variant: variant.to_string(),
        kernel: "recurrent backward",
        source: CompileError(format!("{what}; this is a bug in aec")),
    };
    let mut params = Vec::with_capacity(args.len());
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        let name = match a {
            ArgKind::Size(axis) => {
                params.push(Param::I32);
                out.push(size_arg(shape, *axis));
                continue;
            }
            ArgKind::CuSeqlens => {
                match cu_seqlens {
                    Some(b) => {
                        params.push(Param::In(DType::I32));
                        out.push(Arg::from(b));
                    }
                    None => {
                        params.push(Param::U64);
                        out.push(Arg::from(0u64));
                    }
                }
                continue;
            }
            ArgKind::Tensor(n) | ArgKind::State(n) | ArgKind::Workspace(n) => n.to_string(),
            ArgKind::Custom(n) => n.clone(),
            ArgKind::CustomGrad(n) => format!("grad.{n}"),
            other => {
                return Err(bug(format!(
                    "the kernels take an unknown argument {other:?}"
                )));
            }
        };
        let at = slots
            .iter()
            .position(|(n, _)| *n == name)
            .ok_or_else(|| bug(format!("no tensor for the kernel argument `{name}`")))?;
        let slot = std::mem::replace(&mut slots[at].1, Slot::Null);
        let (param, arg) = match slot {
            Slot::Elem(b) => {
                slots[at].1 = Slot::Elem(b);
                (Param::In(elem), T::arg(b))
            }
            Slot::F32(b) => {
                slots[at].1 = Slot::F32(b);
                (Param::In(DType::F32), Arg::from(b))
            }
            Slot::ElemOut(b) => (Param::Out(elem), T::arg_mut(b)),
            Slot::F32Out(b) => (Param::Out(DType::F32), Arg::from(b)),
            Slot::Null => (Param::U64, Arg::from(0u64)),
        };
        params.push(param);
        out.push(arg);
    }
    Ok((params, out))
}

/// An optional input: the buffer, or a null pointer.
fn opt_in<T: KernelElement>(x: Option<&DeviceBuffer<f32>>) -> Slot<'_, T> {
    x.map_or(Slot::Null, Slot::F32)
}

impl RecurrentKernels {
    fn backward_modules(&self) -> Result<&BackwardModules, Error> {
        if let Some(m) = self.backward.get() {
            return Ok(m);
        }
        let device = self.device();
        let variant = self.variant();
        let dims = self.dims();
        let isa = Isa::for_arch(device.arch());
        let cfg = self.options().recurrent_backward_config.unwrap_or_else(|| {
            self.forward_source()
                .config
                .backward_for(variant, dims.dk, dims.dv, isa)
        });
        if cfg.elem != self.options().elem {
            return Err(Error::Compile {
                variant: variant.name.clone(),
                kernel: "recurrent backward",
                source: CompileError(format!(
                    "KernelOptions::recurrent_backward_config is for {} but the options' elem is {}: set both to the same element type",
                    cfg.elem.name(),
                    self.options().elem.name()
                )),
            });
        }
        let source =
            recurrent_backward(variant, dims.dk, dims.dv, &cfg, isa).map_err(|source| {
                Error::Compile {
                    variant: variant.name.clone(),
                    kernel: "recurrent backward",
                    source,
                }
            })?;
        let load = |code: &str, what: &str| {
            let what = format!("the recurrent {what} of `{}`", variant.name);
            compile_and_load(device, code, self.options(), &what)
        };
        let modules = BackwardModules {
            states: load(&source.states.source, "states pass")?,
            kernels: load(&source.source, "backward kernels")?,
            source,
        };
        let _ = self.backward.set(modules);
        Ok(self.backward.get().expect("set above"))
    }

    /// The generated backward (the states pass and the backward kernels);
    /// generates and compiles it on first use.
    pub fn backward_source(&self) -> Result<&RecurrentBackwardSource, Error> {
        Ok(&self.backward_modules()?.source)
    }

    /// Runs the backward on `stream`, queued: the gradients of `q`, `k`, `v`,
    /// every custom input and, where given, the initial state and normaliser,
    /// for the output gradient `d_o` (`[B, H, S, Dv]`, the element type) and,
    /// optionally, the gradients of the final state (f32 `[B, H, Dk, Dv]`)
    /// and final normaliser (f32 `[B, H, Dk]`) the forward returned.
    ///
    /// Takes the forward's inputs as [`forward`](Self::forward) does and
    /// recomputes what it needs (the state before each chunk). Every check
    /// happens before anything is allocated or launched.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        shape: RecurrentShape,
        initial_state: Option<&DeviceBuffer<f32>>,
        initial_normalizer: Option<&DeviceBuffer<f32>>,
        d_o: &DeviceBuffer<T>,
        d_final_state: Option<&DeviceBuffer<f32>>,
        d_final_normalizer: Option<&DeviceBuffer<f32>>,
    ) -> Result<RecurrentGradients<T>, Error> {
        let name = self.variant().name.clone();
        let inputs = BackwardInputs {
            forward: ForwardInputs {
                q,
                k,
                v,
                customs,
                initial_state,
                initial_normalizer,
            },
            d_o,
            d_final_state,
            d_final_normalizer,
        };
        self.check_backward_buffers(stream, &inputs)?;
        let lens = inputs.forward.lens();
        self.check(
            shape,
            &lens,
            initial_state.map(DeviceBuffer::len),
            initial_normalizer.map(DeviceBuffer::len),
        )?;
        let (b, h, s) = (shape.b, shape.h, shape.s);
        let (dk, dv) = (self.dims().dk as usize, self.dims().dv as usize);
        let normalized = self.normalized();
        let expect = |what: &str, axes: &str, len: usize, want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(Error::Shape(format!(
                    "tensor `{what}` has {len} elements, expected {axes} = {want} for the shape \
                     {shape} and head dims Dk = {dk}, Dv = {dv}"
                )))
            }
        };
        expect("d_o", "[B, H, S, Dv]", d_o.len(), b * h * s * dv)?;
        if let Some(d) = d_final_state {
            expect(
                "d_final_state",
                "[B, H, Dk, Dv] (f32)",
                d.len(),
                b * h * dk * dv,
            )?;
        }
        if let Some(d) = d_final_normalizer {
            if !normalized {
                return Err(Error::Shape(format!(
                    "`{name}` has no normaliser (no `normalize`), so it takes no \
                     `d_final_normalizer`: pass None"
                )));
            }
            expect(
                "d_final_normalizer",
                "[B, H, Dk] (f32)",
                d.len(),
                b * h * dk,
            )?;
        }
        let chunk = self.backward_modules()?.source.config.chunk as usize;
        let layout = Layout {
            shape,
            sequences: b,
            max_len: s,
            chunk_units: b * h * s.div_ceil(chunk),
            cu: None,
        };
        self.run_backward(stream, &inputs, &layout)
    }

    /// The backward of [`forward_varlen`](Self::forward_varlen): a packed
    /// batch of sequences of different lengths, `cu_seqlens` its boundaries
    /// (host, `[N + 1]`, increasing from 0 to the total steps `T`). q, k, v
    /// and `d_o` are `[1, H, T, ·]`, the custom inputs and their gradients
    /// packed likewise; `initial_state`, `d_final_state` and the returned
    /// `d_initial_state` are `[N, H, Dk, Dv]` (normalisers `[N, H, Dk]`). The
    /// same checks as `forward_varlen`, and `d_o` and the final state's
    /// gradients against those shapes, before anything is launched.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_varlen<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        heads: usize,
        cu_seqlens: &[usize],
        initial_state: Option<&DeviceBuffer<f32>>,
        initial_normalizer: Option<&DeviceBuffer<f32>>,
        d_o: &DeviceBuffer<T>,
        d_final_state: Option<&DeviceBuffer<f32>>,
        d_final_normalizer: Option<&DeviceBuffer<f32>>,
    ) -> Result<RecurrentGradients<T>, Error> {
        let inputs = BackwardInputs {
            forward: ForwardInputs {
                q,
                k,
                v,
                customs,
                initial_state,
                initial_normalizer,
            },
            d_o,
            d_final_state,
            d_final_normalizer,
        };
        self.check_backward_buffers(stream, &inputs)?;
        let lens = inputs.forward.lens();
        let shape = check_varlen(
            self.variant(),
            self.dims(),
            heads,
            cu_seqlens,
            &lens,
            initial_state.map(DeviceBuffer::len),
            initial_normalizer.map(DeviceBuffer::len),
        )?;
        let n = cu_seqlens.len() - 1;
        let (h, total) = (shape.h, shape.s);
        let (dk, dv) = (self.dims().dk as usize, self.dims().dv as usize);
        let expect = |what: &str, axes: String, len: usize, want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(Error::Shape(format!(
                    "tensor `{what}` has {len} elements, expected {axes} = {want}"
                )))
            }
        };
        expect(
            "d_o",
            format!("[1, H, T, Dv] = [1, {h}, {total}, {dv}]"),
            d_o.len(),
            h * total * dv,
        )?;
        if let Some(d) = d_final_state {
            expect(
                "d_final_state",
                format!("[N, H, Dk, Dv] = [{n}, {h}, {dk}, {dv}] (f32)"),
                d.len(),
                n * h * dk * dv, // check_varlen bounded it
            )?;
        }
        if let Some(d) = d_final_normalizer {
            if !self.normalized() {
                return Err(Error::Shape(format!(
                    "`{}` has no normaliser (no `normalize`), so it takes no \
                     `d_final_normalizer`: pass None",
                    self.variant().name
                )));
            }
            expect(
                "d_final_normalizer",
                format!("[N, H, Dk] = [{n}, {h}, {dk}] (f32)"),
                d.len(),
                n * h * dk,
            )?;
        }
        // The boundaries, then where each sequence's chunks start.
        let chunk = self.backward_modules()?.source.config.chunk as usize;
        let mut bounds: Vec<i32> = Vec::with_capacity(2 * (n + 1));
        bounds.extend(
            cu_seqlens
                .iter()
                .map(|&t| i32::try_from(t).unwrap_or(i32::MAX)),
        );
        let mut chunks = 0usize;
        bounds.push(0);
        for w in cu_seqlens.windows(2) {
            chunks += (w[1] - w[0]).div_ceil(chunk);
            bounds.push(i32::try_from(chunks).unwrap_or(i32::MAX)); // ≤ T, checked above
        }
        let max_len = cu_seqlens
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        let cu = stream.upload(&bounds).map_err(|e| Error::Runtime {
            during: "uploading `cu_seqlens`".into(),
            source: e,
        })?;
        let layout = Layout {
            shape,
            sequences: n,
            max_len,
            chunk_units: h * chunks,
            cu: Some(&cu),
        };
        self.run_backward(stream, &inputs, &layout)
    }

    /// The backward's buffers are on the kernels' device and of their type.
    fn check_backward_buffers<T: KernelElement>(
        &self,
        stream: &Stream,
        inputs: &BackwardInputs<'_, T>,
    ) -> Result<(), Error> {
        let name = &self.variant().name;
        check_elem::<T>(name, self.elem(), "q, k, v and d_o")?;
        let buffers = inputs
            .forward
            .ordinals()
            .into_iter()
            .chain([("d_o", inputs.d_o.ordinal())])
            .chain(inputs.d_final_state.map(|b| ("d_final_state", b.ordinal())))
            .chain(
                inputs
                    .d_final_normalizer
                    .map(|b| ("d_final_normalizer", b.ordinal())),
            );
        check_devices(self.device(), name, stream, buffers)
    }

    /// Allocates the gradients and workspaces and launches the states pass
    /// and the backward kernels, after the checks.
    fn run_backward<T: KernelElement>(
        &self,
        stream: &Stream,
        inputs: &BackwardInputs<'_, T>,
        layout: &Layout<'_>,
    ) -> Result<RecurrentGradients<T>, Error> {
        let name = self.variant().name.clone();
        let BackwardInputs {
            forward:
                ForwardInputs {
                    q,
                    k,
                    v,
                    customs,
                    initial_state,
                    initial_normalizer,
                },
            d_o,
            d_final_state,
            d_final_normalizer,
        } = *inputs;
        let shape = layout.shape;
        let (b, h, s) = (shape.b, shape.h, shape.s);
        let (dk, dv) = (self.dims().dk as usize, self.dims().dv as usize);
        let normalized = self.normalized();
        let sequences = layout.sequences;
        let modules = self.backward_modules()?;
        let src = &modules.source;
        let units = layout.chunk_units;
        let states_len = [units, dk, dv]
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .filter(|&n| n <= isize::MAX as usize / 4)
            .ok_or_else(|| {
                Error::Shape(format!(
                    "the shape {shape} needs a state per chunk and head of [{units}, Dk, Dv] = \
                     [{units}, {dk}, {dv}] elements, more than this machine can address: split \
                     the batch"
                ))
            })?;

        let runtime = |e| Error::Runtime {
            during: format!("running the recurrent backward of `{name}`"),
            source: e,
        };
        let zeros_f32 = |n: usize| stream.alloc_zeros::<f32>(n.max(1)).map_err(runtime);
        let zeros_elem = |n: usize| stream.alloc_zeros::<T>(n.max(1)).map_err(runtime);
        let rows = b * h * s;
        // The states pass and `_dstate` write every chunk's state and state
        // gradient before anything reads them: no fill (2 × 1 GB for RetNet's
        // benchmark shape).
        let scratch = |n: usize| stream.alloc_scratch::<T>(n.max(1)).map_err(runtime);
        let mut states = scratch(states_len)?;
        let mut dstates = scratch(states_len)?;
        let norm_len = if normalized { units * dk } else { 1 };
        let mut norm_states = zeros_f32(norm_len)?;
        let mut dnorm_states = zeros_f32(norm_len)?;
        let mut o_raw = zeros_elem(if normalized { rows * dv } else { 1 })?;
        let mut dob = zeros_elem(if normalized { rows * dv } else { 1 })?;
        let mut row_n = zeros_f32(if normalized { rows } else { 1 })?;
        let mut dn = zeros_f32(if normalized { rows } else { 1 })?;
        let dlog_len = match (src.decay, src.per_key) {
            (false, _) => 1,
            (true, false) => rows,
            (true, true) => rows * dk,
        };
        let mut dlog = zeros_f32(dlog_len)?;
        let mut dq = zeros_elem(rows * dk)?;
        let mut dkb = zeros_elem(rows * dk)?;
        let mut dvb = zeros_elem(rows * dv)?;
        let mut grads: Vec<(String, DeviceBuffer<f32>)> = Vec::new();
        for c in &self.variant().customs {
            let len = customs
                .iter()
                .find(|(n, _)| *n == c.name)
                .map(|(_, buf)| buf.len())
                .unwrap_or(1);
            grads.push((c.name.clone(), zeros_f32(len)?));
        }
        let mut d_init = match initial_state {
            Some(_) => Some(zeros_f32(sequences * h * dk * dv)?),
            None => None,
        };
        let mut d_init_norm = match initial_normalizer {
            Some(_) => Some(zeros_f32(sequences * h * dk)?),
            None => None,
        };

        let grid = |x: usize| -> Result<(u32, u32, u32), Error> {
            let x = u32::try_from(x)
                .ok()
                .filter(|&x| x <= i32::MAX as u32)
                .ok_or_else(|| {
                    Error::Shape(format!(
                        "the shape {shape} needs a grid larger than CUDA launches: split the call"
                    ))
                })?;
            Ok((x, h as u32, sequences as u32))
        };

        // The states pass.
        {
            let st = &src.states;
            let mut slots: Vec<(String, Slot<'_, T>)> = vec![
                ("q".into(), Slot::Elem(q)),
                ("k".into(), Slot::Elem(k)),
                ("v".into(), Slot::Elem(v)),
                ("o".into(), Slot::ElemOut(&mut o_raw)),
                ("state_in".into(), opt_in(initial_state)),
                ("norm_in".into(), opt_in(initial_normalizer)),
                ("state_out".into(), Slot::Null),
                ("norm_out".into(), Slot::Null),
                ("states".into(), Slot::ElemOut(&mut states)),
                ("norm_states".into(), Slot::F32Out(&mut norm_states)),
                ("row_n".into(), Slot::F32Out(&mut row_n)),
            ];
            slots.extend(customs.iter().map(|(n, b)| (n.to_string(), Slot::F32(b))));
            let (params, mut args) = bind(&name, &st.args, &mut slots, shape, layout.cu)?;
            let kernel = modules.states.kernel(&st.name, &params).map_err(runtime)?;
            let g = st.grid_for(sequences, h).ok_or_else(|| {
                Error::Shape(format!(
                    "the shape {shape} needs a grid for `{}` larger than CUDA launches",
                    st.name
                ))
            })?;
            kernel
                .launch(stream, g, (st.threads, 1, 1), st.smem_bytes, &mut args)
                .map_err(runtime)?;
        }
        // The backward kernels, in order, on one argument list.
        {
            let mut slots: Vec<(String, Slot<'_, T>)> = vec![
                ("q".into(), Slot::Elem(q)),
                ("k".into(), Slot::Elem(k)),
                ("v".into(), Slot::Elem(v)),
                ("do".into(), Slot::Elem(d_o)),
                ("d_state_out".into(), opt_in(d_final_state)),
                ("d_norm_out".into(), opt_in(d_final_normalizer)),
                (
                    "d_state_in".into(),
                    d_init.as_mut().map_or(Slot::Null, Slot::F32Out),
                ),
                (
                    "d_norm_in".into(),
                    d_init_norm.as_mut().map_or(Slot::Null, Slot::F32Out),
                ),
                ("states".into(), Slot::Elem(&states)),
                ("dstates".into(), Slot::ElemOut(&mut dstates)),
                ("norm_states".into(), Slot::F32(&norm_states)),
                ("dnorm_states".into(), Slot::F32Out(&mut dnorm_states)),
                ("o_raw".into(), Slot::Elem(&o_raw)),
                ("row_n".into(), Slot::F32(&row_n)),
                ("dob".into(), Slot::ElemOut(&mut dob)),
                ("dn".into(), Slot::F32Out(&mut dn)),
                ("dlog".into(), Slot::F32Out(&mut dlog)),
                ("dq".into(), Slot::ElemOut(&mut dq)),
                ("dk".into(), Slot::ElemOut(&mut dkb)),
                ("dv".into(), Slot::ElemOut(&mut dvb)),
            ];
            slots.extend(customs.iter().map(|(n, b)| (n.to_string(), Slot::F32(b))));
            slots.extend(
                grads
                    .iter_mut()
                    .map(|(n, b)| (format!("grad.{n}"), Slot::F32Out(b))),
            );
            let (params, mut args) = bind(&name, &src.args, &mut slots, shape, layout.cu)?;
            for kern in &src.kernels {
                let kernel = modules
                    .kernels
                    .kernel(&kern.name, &params)
                    .map_err(runtime)?;
                let g = grid(kern.grid_x.extent(src.dv, layout.max_len, src.config.chunk))?;
                kernel
                    .launch(stream, g, (kern.threads, 1, 1), kern.smem_bytes, &mut args)
                    .map_err(runtime)?;
            }
        }
        Ok(RecurrentGradients {
            dq,
            dk: dkb,
            dv: dvb,
            customs: grads,
            d_initial_state: d_init,
            d_initial_normalizer: d_init_norm,
        })
    }

    pub(super) fn options(&self) -> &super::KernelOptions {
        &self.options
    }
}

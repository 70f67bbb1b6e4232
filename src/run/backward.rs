//! The backward on the GPU: [`ParallelKernels::backward`].

use super::{
    BackwardKernels, Error, ForwardOutput, KernelElement, ParallelKernels, VarlenBatch,
    check_lengths, check_varlen_shapes, compile_and_load, encode_tensor_maps, generate_backward,
    loading_error, params_of, tensor_map_arg, upload_i32,
};
use crate::compiler::{ArgKind, BackwardSource, CompileError, Isa};
use crate::frontend::ir::Axis;
use crate::runtime::{Arg, DeviceBuffer, Stream, bf16};

/// What [`ParallelKernels::backward`] returns: the gradients of the loss with
/// respect to every input, filled once the stream reaches the launches.
#[derive(Debug)]
pub struct Gradients<T: KernelElement = bf16> {
    /// `[B, H, Sq, Dqk]` (`[1, H, Tq, Dqk]` for a packed variable-length
    /// batch), in the kernels' element type.
    pub dq: DeviceBuffer<T>,
    /// `[B, Hkv, Skv, Dqk]` (`[1, Hkv, Tk, Dqk]`), summed over the query
    /// heads of each group.
    pub dk: DeviceBuffer<T>,
    /// `[B, Hkv, Skv, Dv]` (`[1, Hkv, Tk, Dv]`).
    pub dv: DeviceBuffer<T>,
    /// One per custom input of the variant, by name, f32 and shaped like the
    /// input (zeros for inputs no gradient reaches, such as a mask's).
    pub customs: Vec<(String, DeviceBuffer<f32>)>,
}

impl<T: KernelElement> Gradients<T> {
    /// The gradient of custom input `name`.
    pub fn custom(&self, name: &str) -> Option<&DeviceBuffer<f32>> {
        self.customs.iter().find(|(n, _)| n == name).map(|(_, b)| b)
    }
}

impl ParallelKernels {
    /// The backward kernels (of a packed variable-length batch with
    /// `varlen`), generated and compiled on first use.
    fn backward_kernels(&self, varlen: bool) -> Result<&BackwardKernels, Error> {
        let cell = if varlen {
            &self.backward_varlen
        } else {
            &self.backward
        };
        if let Some(k) = cell.get() {
            return Ok(k);
        }
        let source = generate_backward(
            &self.variant,
            self.dims,
            &self.options,
            Isa::for_arch(self.device.arch()),
            varlen,
        )?;
        let params = params_of(
            &self.variant,
            "backward",
            &source.args,
            source.config.elem,
            &["dq", "dk", "dv", "dot", "qmod", "dq_acc"],
        )?;
        let what = format!("the backward kernels of `{}`", self.variant.name);
        let module = compile_and_load(&self.device, &source.source, &self.options, &what)?;
        let loading = loading_error(&self.device, &what);
        let kernel = |name: &str| module.kernel(name, &params).map_err(&loading);
        let kernels = BackwardKernels {
            pre: kernel(&source.pre.name)?,
            main: kernel(&source.main.name)?,
            post: kernel(&source.post.name)?,
            source,
            _module: module,
        };
        // Another thread may have won the race; its kernels are as good.
        let _ = cell.set(kernels);
        Ok(cell.get().expect("set above"))
    }

    /// The generated backward source and its launch facts (compiles the
    /// backward if no call has yet).
    pub fn backward_source(&self) -> Result<&BackwardSource, Error> {
        Ok(&self.backward_kernels(false)?.source)
    }

    /// The backward source for outputs of
    /// [`forward_varlen`](Self::forward_varlen) (compiled on first use).
    pub fn varlen_backward_source(&self) -> Result<&BackwardSource, Error> {
        Ok(&self.backward_kernels(true)?.source)
    }

    /// Runs the backward on `stream`: given the inputs of a
    /// [`forward`](Self::forward) call, its output and `d_o` (the gradient
    /// of the loss with respect to `o`, `[B, H, Sq, Dv]` bf16), computes the
    /// gradients of q, k, v and every custom input.
    ///
    /// The first call generates and compiles the backward kernels (through
    /// the kernel cache). Every check happens before anything is allocated
    /// or launched: the inputs as in `forward`, for `forward.shape`; `d_o`
    /// and the forward output's buffers by length. The weights are
    /// recomputed from the saved row state, so `forward` must be the output
    /// of these kernels on these inputs.
    ///
    /// `forward` may be the output of [`forward_varlen`](Self::forward_varlen):
    /// then q, k, v, `d_o` and the gradients are packed as there
    /// (`[1, heads, rows, D]`), the boundaries are the ones the forward
    /// output carries and are checked again with the inputs
    /// ([`check_varlen_shapes`]), and each sequence's gradients equal the
    /// backward of that sequence alone (custom-input gradients summed over
    /// the sequences).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: KernelElement>(
        &self,
        stream: &Stream,
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        customs: &[(&str, &DeviceBuffer<f32>)],
        forward: &ForwardOutput<T>,
        d_o: &DeviceBuffer<T>,
    ) -> Result<Gradients<T>, Error> {
        self.check_elem::<T>("q, k, v and d_o")?;
        if self.source.v_in_k {
            return Err(Error::Shape(format!(
                "the kernels of `{}` were compiled with `v_in_k` (V stored in K's rows), whose \
                 backward is not implemented: dK and dV would be one tensor. Compile without \
                 `KernelOptions::v_in_k` and pass k and v apart to train",
                self.variant.name
            )));
        }
        let buffers = [
            ("q", q.ordinal()),
            ("k", k.ordinal()),
            ("v", v.ordinal()),
            ("o", forward.o.ordinal()),
            ("d_o", d_o.ordinal()),
        ]
        .into_iter()
        .chain(customs.iter().map(|(n, b)| (*n, b.ordinal())));
        self.check_devices(stream, buffers)?;
        let shape = forward.shape;
        let lens: Vec<(&str, usize)> = [("q", q.len()), ("k", k.len()), ("v", v.len())]
            .into_iter()
            .chain(customs.iter().map(|(n, b)| (*n, b.len())))
            .collect();
        // `shape`: the tensors' (packed) shape; `sizes`: the kernels' size
        // arguments (for a packed batch: N sequences, the longest of each).
        let sizes = match &forward.cu_seqlens {
            None => {
                self.check(shape, &lens)?;
                shape
            }
            Some((cu_q, cu_k)) => {
                let batch = VarlenBatch {
                    heads: shape.h,
                    kv_heads: shape.hkv,
                    cu_seqlens_q: cu_q,
                    cu_seqlens_k: cu_k,
                };
                let (packed, sizes) = check_varlen_shapes(&self.variant, self.dims, &batch, &lens)?;
                if packed != shape {
                    return Err(Error::Shape(format!(
                        "`forward` has shape {shape} but its boundaries and the inputs give {packed}: \
                         pass the output of `forward_varlen` on these inputs"
                    )));
                }
                sizes
            }
        };
        let rows = shape.rows();
        let (dqk, dv) = (self.dims.dqk as usize, self.dims.dv as usize);
        check_lengths(&[
            ("d_o", "[B, H, Sq, Dv]", d_o.len(), rows * dv, shape),
            (
                "forward.o",
                "[B, H, Sq, Dv]",
                forward.o.len(),
                rows * dv,
                shape,
            ),
            (
                "forward.row_outputs",
                "[row outputs, B·H·Sq]",
                forward.row_outputs.len(),
                self.source.row_outputs.len().max(1) * rows,
                shape,
            ),
        ])?;
        let kernels = self.backward_kernels(forward.cu_seqlens.is_some())?;
        let src = &kernels.source;
        // The row and element kernels cover the (packed) rows; the main
        // kernel's grid follows the kernels' sizes (key blocks of the longest
        // sequence, KV heads, sequences).
        let grid = |l: &crate::compiler::Launch, s: crate::run::Shape| {
            l.grid_for([s.b, s.h, s.hkv, s.sq, s.skv], self.dims.dqk)
                .ok_or_else(|| {
                    Error::Shape(format!(
                        "the shape {shape} needs a grid for `{}` larger than CUDA launches: split the call",
                        l.name
                    ))
                })
        };
        let grids = [
            grid(&src.pre, shape)?,
            grid(&src.main, sizes)?,
            grid(&src.post, shape)?,
        ];

        let runtime = |e| Error::Runtime {
            during: format!("running the backward of `{}`", self.variant.name),
            source: e,
        };
        let kv_rows = shape.b * shape.hkv * shape.skv;
        // check_varlen_shapes bounded every boundary by the i32 row counts.
        let boundaries = match &forward.cu_seqlens {
            Some((cu_q, cu_k)) => Some((
                upload_i32(stream, "cu_seqlens_q", cu_q.iter().copied())?,
                upload_i32(stream, "cu_seqlens_k", cu_k.iter().copied())?,
            )),
            None => None,
        };
        let mut dot = stream
            .alloc_zeros::<f32>(src.workspace_len("dot", rows))
            .map_err(runtime)?;
        let mut qmod = stream
            .alloc_zeros::<T>(src.workspace_len("qmod", rows))
            .map_err(runtime)?;
        let mut dq_acc = stream
            .alloc_zeros::<f32>(src.workspace_len("dq_acc", rows))
            .map_err(runtime)?;
        let mut dq = stream.alloc_zeros::<T>(rows * dqk).map_err(runtime)?;
        let mut dk = stream.alloc_zeros::<T>(kv_rows * dqk).map_err(runtime)?;
        let mut dvb = stream.alloc_zeros::<T>(kv_rows * dv).map_err(runtime)?;
        let mut grads: Vec<(String, DeviceBuffer<f32>)> = Vec::new();
        for (name, buf) in customs {
            grads.push((
                name.to_string(),
                stream.alloc_zeros::<f32>(buf.len()).map_err(runtime)?,
            ));
        }
        // TMA loads: tensor maps of q and dO for this call (they hold the
        // buffers' addresses).
        let maps = encode_tensor_maps(stream, &src.tensor_maps, sizes, |t| {
            if t == "q" { q } else { d_o }
        })
        .map_err(runtime)?;
        {
            let mut outs_dot = Some(&mut dot);
            let mut outs_qmod = Some(&mut qmod);
            let mut outs_acc = Some(&mut dq_acc);
            let mut outs_dq = Some(&mut dq);
            let mut outs_dk = Some(&mut dk);
            let mut outs_dv = Some(&mut dvb);
            let mut grad_slots: Vec<(&str, Option<&mut DeviceBuffer<f32>>)> = grads
                .iter_mut()
                .map(|(n, b)| (n.as_str(), Some(b)))
                .collect();
            let twice = |what: &str| Error::Compile {
                variant: self.variant.name.clone(),
                kernel: "backward",
                source: CompileError(format!(
                    "the generated kernels take `{what}` twice; this is a bug in aec"
                )),
            };
            let mut args: Vec<Arg<'_>> = Vec::with_capacity(src.args.len());
            for a in &src.args {
                args.push(match a {
                    ArgKind::Tensor("q") => T::arg(q),
                    ArgKind::Tensor("k") => T::arg(k),
                    ArgKind::Tensor("v") => T::arg(v),
                    ArgKind::Tensor("o") => T::arg(&forward.o),
                    ArgKind::Tensor("dout") => T::arg(d_o),
                    ArgKind::RowOut => Arg::from(&forward.row_outputs),
                    ArgKind::Workspace("dot") => {
                        Arg::from(outs_dot.take().ok_or_else(|| twice("dot"))?)
                    }
                    ArgKind::Workspace("qmod") => {
                        T::arg_mut(outs_qmod.take().ok_or_else(|| twice("qmod"))?)
                    }
                    ArgKind::Workspace("dq_acc") => {
                        Arg::from(outs_acc.take().ok_or_else(|| twice("dq_acc"))?)
                    }
                    ArgKind::Tensor("dq") => T::arg_mut(outs_dq.take().ok_or_else(|| twice("dq"))?),
                    ArgKind::Tensor("dk") => T::arg_mut(outs_dk.take().ok_or_else(|| twice("dk"))?),
                    ArgKind::Tensor("dv") => T::arg_mut(outs_dv.take().ok_or_else(|| twice("dv"))?),
                    ArgKind::Custom(name) => Arg::from(
                        customs
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, b)| *b)
                            .expect("check_shapes found every custom input"),
                    ),
                    ArgKind::CustomGrad(name) => {
                        let slot = grad_slots
                            .iter_mut()
                            .find(|(n, _)| n == name)
                            .expect("one gradient per custom input");
                        Arg::from(slot.1.take().ok_or_else(|| twice(name))?)
                    }
                    ArgKind::Size(axis) => {
                        let n = match axis {
                            Axis::Dqk => dqk,
                            Axis::Dv => dv,
                            a => sizes.size(*a).expect("backward_params accepted the axis"),
                        };
                        Arg::from(i32::try_from(n).expect("check_shapes bounded every size"))
                    }
                    ArgKind::CuSeqlens | ArgKind::CuSeqlensKv => {
                        let (cu_q, cu_k) = boundaries.as_ref().ok_or_else(|| {
                            Error::Compile {
                            variant: self.variant.name.clone(),
                            kernel: "backward",
                            source: CompileError(
                                "the dense backward takes sequence boundaries; this is a bug in aec"
                                    .into(),
                            ),
                        }
                        })?;
                        Arg::from(if *a == ArgKind::CuSeqlens { cu_q } else { cu_k })
                    }
                    ArgKind::TensorMap(name) => tensor_map_arg(&maps, name),
                    other => unreachable!("backward_params rejected {other:?}"),
                });
            }
            for (kernel, launch, g) in [
                (&kernels.pre, &src.pre, grids[0]),
                (&kernels.main, &src.main, grids[1]),
                (&kernels.post, &src.post, grids[2]),
            ] {
                kernel
                    .launch(
                        stream,
                        g,
                        (launch.threads, 1, 1),
                        launch.smem_bytes,
                        &mut args,
                    )
                    .map_err(runtime)?;
            }
        }
        Ok(Gradients {
            dq,
            dk,
            dv: dvb,
            customs: grads,
        })
    }
}

//! The launch plans the library loaders follow agree with the launch logic
//! of aec's own Rust runtime: for every parallel example and both
//! instruction sets, the plan's grids, KV-split counts and workspace sizes
//! evaluate to what `KernelSource` and `Launch` compute, over many shapes;
//! for every recurrent example, the backward plan's launches (the states
//! pass in its own module, then the backward kernels), grids, arguments and
//! workspaces agree with `RecurrentBackwardSource` and what
//! `src/run/recurrent_backward.rs` allocates.

mod common;

use aec::compiler::launch_plan::{
    ArgPlan, Condition, Dtype, EntryPlan, Role, STATES_MODULE, SizeExpr, backward_plan,
    forward_plan, grad_name, recurrent_backward_plan,
};
use aec::compiler::{
    ArgKind, BackwardConfig, Elem, ForwardConfig, Isa, RecurrentConfig, Residency,
    parallel_backward, parallel_forward, recurrent_backward,
};

/// The KV-split wave cap of an H100's 228 KiB of shared memory per SM.
const H100: Residency = Residency::SharedMemory(228 * 1024);

/// Shapes `[B, H, Hkv, Sq, Skv]` that are not tile multiples, GQA among them.
const SHAPES: [[usize; 5]; 6] = [
    [1, 8, 8, 1, 32768],
    [2, 16, 4, 3, 777],
    [4, 8, 2, 200, 333],
    [1, 32, 8, 1, 100],
    [8, 16, 16, 1000, 1000],
    [3, 4, 1, 17, 5000],
];

fn vars(shape: [usize; 5], splits: u64) -> impl Fn(&str) -> Option<u64> {
    vars_on(shape, splits, 132)
}

/// [`vars`] on a device with `sms` multiprocessors (persistent grids read it).
fn vars_on(shape: [usize; 5], splits: u64, sms: u64) -> impl Fn(&str) -> Option<u64> {
    move |n: &str| {
        Some(match n {
            "B" => shape[0] as u64,
            "H" => shape[1] as u64,
            "Hkv" => shape[2] as u64,
            "Sq" => shape[3] as u64,
            "Skv" => shape[4] as u64,
            "kv_splits" => splits,
            "sms" => sms,
            _ => return None,
        })
    }
}

fn grid(g: &[SizeExpr; 3], vars: &dyn Fn(&str) -> Option<u64>) -> (u32, u32, u32) {
    let e = |i: usize| g[i].eval(vars).expect("the plan's grid evaluates") as u32;
    (e(0), e(1), e(2))
}

/// Every pointer argument names a buffer of the plan, and every buffer a
/// launch reads or writes is passed to some launch.
fn check_arguments(name: &str, plan: &EntryPlan) {
    for l in &plan.launches {
        for a in &l.args {
            if let ArgPlan::Ptr(b) = a {
                assert!(
                    plan.buffer(b).is_some(),
                    "{name}: `{b}` is not a buffer of the plan"
                );
            }
            if let ArgPlan::TensorMap(m) = a {
                let b = plan.buffer(&m.buffer).unwrap_or_else(|| {
                    panic!("{name}: the map of `{}` is not a buffer's", m.buffer)
                });
                assert_eq!(b.role, Role::Input, "{name}: maps `{}`", m.buffer);
            }
        }
    }
    for b in &plan.buffers {
        let used = plan
            .launches
            .iter()
            .any(|l| l.args.iter().any(|a| *a == ArgPlan::Ptr(b.name.clone())));
        assert!(used, "{name}: buffer `{}` is passed to no launch", b.name);
    }
}

/// Kernels launched in clusters of two (`ForwardConfig::kv_multicast`):
/// the plan's grid is the runtime's, even, a cluster per two SMs at most
/// (an odd unit count gets one idle CTA; an odd SM count leaves one SM
/// idle rather than a cluster waiting for a second wave).
#[test]
fn cluster_pair_grids_match_the_runtime() {
    for name in ["deepseek", "softmax"] {
        let v = common::example(name);
        let (dqk, dv) = common::head_dims(&v);
        let cfg = ForwardConfig {
            kv_multicast: true,
            ..ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a)
        };
        let k = parallel_forward(&v, dqk, dv, &cfg).unwrap();
        assert!(k.cluster_pairs, "{name}: {}", k.name);
        let plan = forward_plan(&v, &k);
        for shape in [
            [8, 16, 16, 2048, 2048],
            [1, 3, 3, 200, 333],
            [2, 40, 40, 512, 512],
        ] {
            let [b, h, hkv, sq, _] = shape;
            for sms in [132, 131, 7, 2] {
                let planned = grid(&plan.launches[0].grid, &vars_on(shape, 1, sms));
                assert_eq!(
                    Some(planned),
                    k.launch_grid([b, h, hkv, sq], sms as u32, 1),
                    "{name} {shape:?} on {sms} SMs"
                );
                assert!(
                    planned.0.is_multiple_of(2) && planned.0 > 0 && planned.0 as u64 <= sms,
                    "{planned:?}"
                );
            }
        }
        // 1 × 3 heads × one pair of row blocks: three units, four CTAs.
        assert_eq!(k.launch_grid([1, 3, 3, 200], 132, 1), Some((4, 1, 1)));
        assert_eq!(k.launch_grid([8, 16, 16, 2048], 131, 1), Some((130, 1, 1)));
    }
}

#[test]
fn plans_match_the_runtime_launch_logic() {
    let mut checked_splits = 0;
    let mut checked_persistent = 0;
    for (name, v) in common::parallel_examples() {
        let (dqk, dv) = common::head_dims(&v);
        for isa in [Isa::Sm80, Isa::Sm90a] {
            let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, isa);
            let Ok(k) = parallel_forward(&v, dqk, dv, &cfg) else {
                continue;
            };
            let plan = forward_plan(&v, &k);
            check_arguments(&name, &plan);
            // The split launch, whose occupancy caps the splits, is the
            // main kernel where the plan splits at all.
            assert_eq!(
                plan.split_launch(),
                plan.kv_splits.as_ref().map(|_| 0),
                "{name} {isa:?}: the split launch"
            );
            for shape in SHAPES {
                let shape = match v.fixed_sizes.iter().find(|(a, _)| a.name() == "Sq") {
                    Some((_, n)) => [shape[0], shape[1], shape[2], *n, shape[4]],
                    None => shape,
                };
                let [b, h, hkv, sq, _] = shape;
                // Without the wave cap, with an H100's shared memory, with
                // the driver's counts.
                for residency in [
                    Residency::Unknown,
                    H100,
                    Residency::Blocks(1),
                    Residency::Blocks(2),
                ] {
                    let splits = k.kv_splits(shape, 132, residency);
                    let planned = match &plan.kv_splits {
                        Some(p) => p.splits(&vars(shape, 1), 132, residency),
                        None => 1,
                    };
                    assert_eq!(
                        planned, splits as u64,
                        "{name} {isa:?} {shape:?} {residency:?}: kv splits"
                    );
                }
                let splits = k.kv_splits(shape, 132, H100);
                let planned = splits as u64;
                checked_splits += usize::from(splits > 1);
                let at = vars(shape, planned);
                let main = &plan.launches[0];
                assert_eq!(main.entry, k.name);
                for sms in [132, 7] {
                    assert_eq!(
                        Some(grid(&main.grid, &vars_on(shape, planned, sms))),
                        k.launch_grid([b, h, hkv, sq], sms as u32, splits),
                        "{name} {isa:?} {shape:?} on {sms} SMs: forward grid"
                    );
                }
                checked_persistent += usize::from(k.persistent);
                if let Some(combine) = plan.launches.get(1) {
                    assert_eq!(combine.when, Some(Condition::SplitKv));
                    assert_eq!(Some(grid(&combine.grid, &at)), k.combine_grid(b * h * sq));
                    for ws in ["opart", "spart"] {
                        let buf = plan.buffer(ws).expect("split-KV workspace");
                        assert_eq!(buf.role, Role::Workspace);
                        assert_eq!(
                            buf.elements(&at),
                            Some(k.workspace_len(ws, b * h * sq, splits) as u64),
                            "{name}: {ws}"
                        );
                    }
                }
            }
            let cfg = BackwardConfig::default_for(dqk, dv, Elem::Bf16, isa);
            let Ok(bw) = parallel_backward(&v, dqk, dv, &cfg) else {
                continue;
            };
            let plan = backward_plan(&v, (dqk, dv), Elem::Bf16, bw.kernels());
            check_arguments(&name, &plan);
            for shape in SHAPES {
                let at = vars(shape, 1);
                for (l, launch) in plan.launches.iter().zip([&bw.pre, &bw.main, &bw.post]) {
                    assert_eq!(l.entry, launch.name);
                    assert_eq!(
                        Some(grid(&l.grid, &at)),
                        launch.grid_for(shape, dqk),
                        "{name} {isa:?} {shape:?}: {}",
                        l.entry
                    );
                }
                let rows = (shape[0] * shape[1] * shape[3]) as u64;
                for ws in ["dot", "dq_acc"] {
                    assert_eq!(
                        plan.buffer(ws).and_then(|b| b.elements(&at)),
                        Some(bw.workspace_len(ws, rows as usize) as u64),
                        "{name}: {ws}"
                    );
                }
            }
            for c in &v.customs {
                let g = plan
                    .buffer(&format!("d{}", c.name))
                    .expect("custom gradient");
                assert!(g.zeroed && g.role == Role::Output, "{name}: d{}", c.name);
            }
        }
    }
    assert!(checked_splits > 0, "some shape must split the KV sequence");
    assert!(
        checked_persistent > 0,
        "some default Hopper forward must be persistent"
    );
}

/// A forward that merges its own KV splits (`fused_combine`): one launch,
/// the same KV-split rule, and a zeroed `split_count` workspace only when
/// it splits, with a counter per block of the grid before splits.
#[test]
fn fused_combine_plans_launch_one_kernel_with_zeroed_counters() {
    let v = common::example("decode");
    let cfg = ForwardConfig {
        fused_combine: true,
        ..ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm80)
    };
    let k = parallel_forward(&v, 128, 128, &cfg).expect("fused decoding forward");
    let plan = forward_plan(&v, &k);
    check_arguments("decode (fused combine)", &plan);
    assert_eq!(plan.launches.len(), 1, "{:?}", plan.launches);
    let count = plan.buffer("split_count").expect("the counters");
    assert!(count.zeroed && count.role == Role::Workspace);
    assert_eq!(count.when, Some(Condition::SplitKv));
    let mut split = 0;
    for shape in SHAPES {
        let shape = [shape[0], shape[1], shape[2], 1, shape[4]];
        let [b, h, hkv, sq, _] = shape;
        let splits = k.kv_splits(shape, 132, H100);
        let planned =
            plan.kv_splits
                .as_ref()
                .expect("a split rule")
                .splits(&vars(shape, 1), 132, H100);
        assert_eq!(planned, u64::from(splits), "{shape:?}");
        split += usize::from(splits > 1);
        let at = vars(shape, planned);
        assert_eq!(
            count.elements(&at),
            Some(k.split_count_len([b, h, hkv, sq]) as u64),
            "{shape:?}"
        );
        let (x, y, z) = k.grid_for([b, h, hkv, sq]).expect("grid");
        assert_eq!(k.split_count_len([b, h, hkv, sq]), (x * y * z) as usize);
    }
    assert!(split > 0, "some shape must split");
}

/// Recurrent shapes `[B, H, S]`: one step, part of a chunk, a chunk and one
/// step, exact chunks, many chunks.
const RECURRENT_SHAPES: [[usize; 3]; 6] = [
    [1, 1, 1],
    [2, 4, 63],
    [3, 2, 65],
    [1, 8, 128],
    [2, 16, 1000],
    [4, 3, 4097],
];

#[test]
fn recurrent_backward_plans_match_the_backward_source() {
    let mut checked = 0;
    for path in std::fs::read_dir(common::examples_dir()).expect("examples") {
        let path = path.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read example");
        for inv in aec::frontend::parse_file(&src).expect("rust file") {
            let v = inv.variant.expect("valid example");
            if v.recurrent().is_none() {
                continue;
            }
            let name = v.name.clone();
            for (dk, dv) in [(128, 128), (64, 96), (32, 64)] {
                for isa in [Isa::Sm80, Isa::Sm90a] {
                    let cfg = RecurrentConfig::default_for(dk, dv, Elem::Bf16, isa);
                    let Ok(b) = recurrent_backward(&v, dk, dv, &cfg, isa) else {
                        continue;
                    };
                    let plan = recurrent_backward_plan(&v, &b);
                    check_recurrent_backward(&name, &v, &b, &plan);
                    checked += 1;
                }
            }
            // The backward template refuses Dk = 16 (the forward takes it):
            // `aec compile` records the reason instead of a plan.
            let cfg = RecurrentConfig::default_for(16, 64, Elem::Bf16, Isa::Sm80);
            let e = recurrent_backward(&v, 16, 64, &cfg, Isa::Sm80).expect_err("Dk = 16");
            assert!(e.0.contains("Dk = 16"), "{name}: {e:?}");
        }
    }
    // RetNet, gated retention, GLA, Mamba2, RFA at three head dims, two ISAs.
    assert!(
        checked >= 4 * 3 * 2,
        "only {checked} recurrent backward plans checked"
    );
}

fn check_recurrent_backward(
    name: &str,
    v: &aec::frontend::Variant,
    b: &aec::compiler::RecurrentBackwardSource,
    plan: &EntryPlan,
) {
    let (dk, dv, chunk) = (b.dk as usize, b.dv as usize, b.config.chunk);
    check_arguments(name, plan);
    aec::library::validate_plan(plan).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(plan.pass, "backward");
    // The states pass first, from its own module; then the kernels in order.
    assert_eq!(plan.launches.len(), 1 + b.kernels.len(), "{name}");
    let st = &plan.launches[0];
    assert_eq!(st.entry, b.states.name);
    assert_eq!(st.module.as_deref(), Some(STATES_MODULE));
    assert_eq!(
        (st.threads, st.dynamic_smem_bytes),
        (b.states.threads, b.states.smem_bytes)
    );
    for (l, k) in plan.launches[1..].iter().zip(&b.kernels) {
        assert_eq!(l.entry, k.name);
        assert_eq!(l.module, None, "{name}: {} is in the main module", k.name);
        assert_eq!((l.threads, l.dynamic_smem_bytes), (k.threads, k.smem_bytes));
    }
    // Arguments: the kernels' own list, in order; the states pass writes its
    // output into `o_raw` and never fills `state_out` / `norm_out`.
    let expect = |args: &[ArgKind], states_pass: bool| -> Vec<ArgPlan> {
        args.iter()
            .map(|a| match a {
                ArgKind::Tensor("o") if states_pass => ArgPlan::Ptr("o_raw".into()),
                ArgKind::State(n @ ("state_out" | "norm_out")) if states_pass => {
                    ArgPlan::Null(n.to_string())
                }
                ArgKind::Tensor(n) | ArgKind::State(n) | ArgKind::Workspace(n) => {
                    ArgPlan::Ptr(n.to_string())
                }
                ArgKind::Custom(n) => ArgPlan::Ptr(n.clone()),
                ArgKind::CustomGrad(n) => ArgPlan::Ptr(grad_name(n)),
                ArgKind::Size(a) => ArgPlan::I32(SizeExpr::var(a.name())),
                // Libraries launch batches of equal lengths.
                ArgKind::CuSeqlens => ArgPlan::Null("cu_seqlens".into()),
                other => panic!("{name}: unexpected argument {other:?}"),
            })
            .collect()
    };
    assert_eq!(st.args, expect(&b.states.args, true), "{name}: states pass");
    assert!(st.args.contains(&ArgPlan::Null("state_out".into())));
    for l in &plan.launches[1..] {
        assert_eq!(l.args, expect(&b.args, false), "{name}: {}", l.entry);
    }
    // Roles and zero-filling.
    let role = |n: &str| {
        plan.buffer(n)
            .unwrap_or_else(|| panic!("{name}: no `{n}`"))
            .role
    };
    assert_eq!(role("do"), Role::Input);
    assert_eq!(role("state_in"), Role::OptionalInput);
    assert_eq!(role("d_state_out"), Role::OptionalInput);
    assert_eq!(role("d_state_in"), Role::OptionalOutput);
    for n in ["dq", "dk", "dv"] {
        assert_eq!(role(n), Role::Output);
        assert!(!plan.buffer(n).unwrap().zeroed);
    }
    for c in &v.customs {
        let g = plan.buffer(&grad_name(&c.name)).expect("custom gradient");
        assert!(
            g.zeroed && g.role == Role::Output && g.dtype == Dtype::F32,
            "{name}: d{}",
            c.name
        );
    }
    assert_eq!(plan.buffer("norm_in").is_some(), b.normalized, "{name}");
    assert_eq!(plan.buffer("d_norm_in").is_some(), b.normalized, "{name}");
    match plan.buffer("dlog") {
        Some(d) => assert!(b.decay && d.zeroed && d.role == Role::Workspace, "{name}"),
        None => assert!(!b.decay, "{name}: a decay needs dlog"),
    }
    for w in ["states", "dstates"] {
        assert!(!plan.buffer(w).unwrap().zeroed, "{name}: {w}");
    }
    for shape in RECURRENT_SHAPES {
        let [bs, h, s] = shape;
        let at = |n: &str| {
            Some(match n {
                "B" => bs as u64,
                "H" => h as u64,
                "S" => s as u64,
                _ => return None,
            })
        };
        // Grids: the states pass as the forward's; the kernels' x from
        // RecurrentGridX::extent (chunks of a partial last chunk included).
        let g0 = grid(&st.grid, &at);
        assert_eq!(Some(g0), b.states.grid_for(bs, h), "{name} {shape:?}");
        for (l, k) in plan.launches[1..].iter().zip(&b.kernels) {
            assert_eq!(
                grid(&l.grid, &at),
                (k.grid_x.extent(b.dv, s, chunk) as u32, h as u32, bs as u32),
                "{name} {shape:?}: {}",
                l.entry
            );
        }
        // Workspace and output sizes as src/run/recurrent_backward.rs
        // allocates them.
        let chunks = s.div_ceil(chunk as usize);
        let rows = bs * h * s;
        let len = |n: &str| {
            plan.buffer(n)
                .and_then(|x| x.elements(&at))
                .map(|x| x as usize)
        };
        assert_eq!(
            len("states"),
            Some(bs * h * chunks * dk * dv),
            "{name} {shape:?}"
        );
        assert_eq!(len("dstates"), Some(bs * h * chunks * dk * dv));
        assert_eq!(len("dq"), Some(rows * dk));
        assert_eq!(len("dk"), Some(rows * dk));
        assert_eq!(len("dv"), Some(rows * dv));
        assert_eq!(len("do"), Some(rows * dv));
        assert_eq!(len("d_state_out"), Some(bs * h * dk * dv));
        assert_eq!(len("d_state_in"), Some(bs * h * dk * dv));
        if b.normalized {
            assert_eq!(len("norm_states"), Some(bs * h * chunks * dk));
            assert_eq!(len("dnorm_states"), Some(bs * h * chunks * dk));
            assert_eq!(len("o_raw"), Some(rows * dv));
            assert_eq!(len("dob"), Some(rows * dv));
            assert_eq!(len("row_n"), Some(rows));
            assert_eq!(len("dn"), Some(rows));
            assert_eq!(len("d_norm_out"), Some(bs * h * dk));
        }
        if b.decay {
            let per_step = if b.per_key { dk } else { 1 };
            assert_eq!(len("dlog"), Some(rows * per_step), "{name}");
        }
        let el = |n: &str| plan.buffer(n).unwrap().dtype;
        assert_eq!(el("states"), Dtype::Bf16);
        assert_eq!(el("d_state_out"), Dtype::F32);
    }
}

#[test]
fn tensor_maps_cover_their_inputs_exactly() {
    let mut checked = 0;
    for (name, v) in common::parallel_examples() {
        let (dqk, dv) = common::head_dims(&v);
        let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, Isa::Sm90a);
        let Ok(k) = parallel_forward(&v, dqk, dv, &cfg) else {
            continue;
        };
        let plan = forward_plan(&v, &k);
        let maps: Vec<_> = plan.launches[0]
            .args
            .iter()
            .filter_map(|a| match a {
                ArgPlan::TensorMap(m) => Some(m),
                _ => None,
            })
            .collect();
        assert_eq!(maps.len(), k.tensor_maps.len(), "{name}");
        for m in maps {
            let buffer = plan.buffer(&m.buffer).expect("a buffer");
            assert_eq!(m.box_dims[0] as u64 * buffer.dtype.bytes(), 128, "{name}");
            for mut shape in SHAPES {
                // (K and V declared with H heads: the call's Hkv is H.)
                if plan.equal.contains(&["Hkv".to_string(), "H".to_string()]) {
                    shape[2] = shape[1];
                }
                // The extents' product is the tensor's element count: the
                // map neither reads past it nor misses rows.
                let at = vars(shape, 1);
                let covered = m
                    .dims
                    .iter()
                    .map(|e| e.eval(&at).expect("known sizes"))
                    .product::<u64>();
                assert_eq!(
                    Some(covered),
                    buffer.elements(&at),
                    "{name} {} {shape:?}",
                    m.buffer
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} tensor maps checked");
    // The manifest's JSON form, which the C and Python loaders read.
    let v = common::example("softmax");
    let k = parallel_forward(
        &v,
        128,
        128,
        &ForwardConfig::default_for(&v, 128, 128, Elem::Bf16, Isa::Sm90a),
    )
    .expect("forward");
    let plan = forward_plan(&v, &k);
    let json = serde_json::to_value(&plan.launches[0].args).expect("json");
    let n = json.as_array().expect("array").len();
    assert_eq!(
        json[n - 3],
        serde_json::json!({"tensor_map": {"buffer": "q", "dims": [128, "Sq", {"mul": ["B", "H"]}], "box": [64, 128, 1]}})
    );
}

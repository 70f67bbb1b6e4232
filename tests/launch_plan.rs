//! The launch plans the library loaders follow agree with the launch logic
//! of aec's own Rust runtime: for every parallel example and both
//! instruction sets, the plan's grids, KV-split counts and workspace sizes
//! evaluate to what `KernelSource` and `Launch` compute, over many shapes.

mod common;

use aec::compiler::launch_plan::{
    ArgPlan, Condition, EntryPlan, Role, SizeExpr, backward_plan, forward_plan,
};
use aec::compiler::{
    BackwardConfig, Elem, ForwardConfig, Isa, parallel_backward, parallel_forward,
};

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
    move |n: &str| {
        Some(match n {
            "B" => shape[0] as u64,
            "H" => shape[1] as u64,
            "Hkv" => shape[2] as u64,
            "Sq" => shape[3] as u64,
            "Skv" => shape[4] as u64,
            "kv_splits" => splits,
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

#[test]
fn plans_match_the_runtime_launch_logic() {
    let mut checked_splits = 0;
    for (name, v) in common::parallel_examples() {
        let (dqk, dv) = common::head_dims(&v);
        for isa in [Isa::Sm80, Isa::Sm90a] {
            let cfg = ForwardConfig::default_for(&v, dqk, dv, Elem::Bf16, isa);
            let Ok(k) = parallel_forward(&v, dqk, dv, &cfg) else {
                continue;
            };
            let plan = forward_plan(&v, &k);
            check_arguments(&name, &plan);
            for shape in SHAPES {
                let shape = match v.fixed_sizes.iter().find(|(a, _)| a.name() == "Sq") {
                    Some((_, n)) => [shape[0], shape[1], shape[2], *n, shape[4]],
                    None => shape,
                };
                let [b, h, hkv, sq, _] = shape;
                let splits = k.kv_splits(shape, 132);
                let planned = match &plan.kv_splits {
                    Some(p) => p.splits(&vars(shape, 1), 132),
                    None => 1,
                };
                assert_eq!(
                    planned, splits as u64,
                    "{name} {isa:?} {shape:?}: kv splits"
                );
                checked_splits += usize::from(splits > 1);
                let at = vars(shape, planned);
                let main = &plan.launches[0];
                assert_eq!(main.entry, k.name);
                assert_eq!(
                    Some(grid(&main.grid, &at)),
                    k.split_grid_for([b, h, hkv, sq], splits),
                    "{name} {isa:?} {shape:?}: forward grid"
                );
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
            let plan = backward_plan(
                &v,
                (dqk, dv),
                Elem::Bf16,
                [&bw.pre, &bw.main, &bw.post],
                &bw.args,
                &bw.row_outputs,
            );
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
}

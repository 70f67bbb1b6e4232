//! Level 2 of the search: where each intermediate of a kernel plan lives.
//!
//! A tile configuration fixes the block tile (`block_m` × `block_n`); the
//! tiles of the kernel's intermediates follow from it through the two GEMMs
//! (`S = Q·Kᵀ` is `block_m × block_n`, `O = P·V` is `block_m × Dv`, …). Each
//! intermediate starts in the fastest tier its template allows; while the
//! plan does not fit, the largest one that may move is demoted (registers →
//! shared → global). A plan whose register-only intermediates alone do not
//! fit is rejected, with the reason recorded.

use serde::Serialize;
use std::fmt;

/// Where an intermediate tile is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Tier {
    Register,
    Shared,
    Global,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Register => "registers",
            Tier::Shared => "shared memory",
            Tier::Global => "global memory",
        })
    }
}

/// One intermediate of a kernel plan: its tile per block, buffers, and the
/// tiers its template can hold it in (fastest first).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntermediateTensor {
    /// `q`, `k`, `v`, `s`, `p`, `o`, `state`.
    pub name: &'static str,
    /// Tile rows × columns per block.
    pub rows: u32,
    pub cols: u32,
    pub elem_bytes: u32,
    /// Pipeline buffers (the K/V ring's stages); 1 otherwise.
    pub stages: u32,
    /// The tiers the template supports for it, fastest first.
    pub tiers: Vec<Tier>,
    /// Where it is placed (the first of `tiers` until [`place`] moves it).
    pub tier: Tier,
}

impl IntermediateTensor {
    pub fn new(
        name: &'static str,
        (rows, cols): (u32, u32),
        elem_bytes: u32,
        stages: u32,
        tiers: &[Tier],
    ) -> IntermediateTensor {
        IntermediateTensor {
            name,
            rows,
            cols,
            elem_bytes,
            stages,
            tiers: tiers.to_vec(),
            tier: tiers[0],
        }
    }

    /// Bytes of all its buffers.
    pub fn bytes(&self) -> u32 {
        self.rows * self.cols * self.elem_bytes * self.stages
    }

    /// 32-bit registers per thread when `threads` threads hold it.
    pub fn registers(&self, threads: u32) -> u32 {
        self.bytes().div_ceil(4 * threads.max(1))
    }
}

/// What a plan may use: registers per computing thread (after the fixed
/// registers every kernel needs) and shared memory per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// Threads that hold register tiles (the computing warps).
    pub threads: u32,
    /// Registers per computing thread available to tiles.
    pub registers: u32,
    /// Shared memory per block available to tiles, bytes.
    pub shared: u32,
}

/// A placement that fits: the intermediates with their tiers, and what they use.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placement {
    pub tensors: Vec<IntermediateTensor>,
    pub registers: u32,
    pub shared: u32,
}

impl Placement {
    pub fn tier_of(&self, name: &str) -> Option<Tier> {
        self.tensors.iter().find(|t| t.name == name).map(|t| t.tier)
    }
}

fn usage(tensors: &[IntermediateTensor], budget: &Budget) -> (u32, u32) {
    let regs = tensors
        .iter()
        .filter(|t| t.tier == Tier::Register)
        .map(|t| t.registers(budget.threads))
        .sum();
    let shared = tensors
        .iter()
        .filter(|t| t.tier == Tier::Shared)
        .map(|t| t.bytes())
        .sum();
    (regs, shared)
}

/// Places `tensors` within `budget`: registers first; while registers
/// overflow, the largest register tile that may move goes down a tier; then
/// the same for shared memory. `Err` names what does not fit and why.
pub fn place(mut tensors: Vec<IntermediateTensor>, budget: &Budget) -> Result<Placement, String> {
    for t in &mut tensors {
        t.tier = t.tiers[0];
    }
    for (tier, limit, unit) in [
        (Tier::Register, budget.registers, "registers per thread"),
        (Tier::Shared, budget.shared, "bytes of shared memory"),
    ] {
        loop {
            let (regs, shared) = usage(&tensors, budget);
            let used = if tier == Tier::Register { regs } else { shared };
            if used <= limit {
                break;
            }
            // The largest tile in this tier that has a slower tier to go to.
            let movable = tensors
                .iter_mut()
                .filter(|t| t.tier == tier && t.tiers.iter().any(|&x| x > tier))
                .max_by_key(|t| (t.bytes(), std::cmp::Reverse(t.name)));
            match movable {
                Some(t) => t.tier = *t.tiers.iter().find(|&&x| x > tier).unwrap(),
                None => {
                    let fixed: Vec<String> = tensors
                        .iter()
                        .filter(|t| t.tier == tier)
                        .map(|t| format!("{} {}x{}", t.name, t.rows, t.cols))
                        .collect();
                    return Err(format!(
                        "{used} {unit} needed, {limit} available; {} cannot leave {tier} in this template",
                        fixed.join(", ")
                    ));
                }
            }
        }
    }
    let (registers, shared) = usage(&tensors, budget);
    Ok(Placement {
        tensors,
        registers,
        shared,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Tier::*;

    fn budget(registers: u32, shared: u32) -> Budget {
        Budget {
            threads: 128,
            registers,
            shared,
        }
    }

    #[test]
    fn largest_movable_tile_is_demoted_first() {
        let tensors = vec![
            // 64x128 bf16 over 128 threads: 32 registers.
            IntermediateTensor::new("q", (64, 128), 2, 1, &[Register, Shared]),
            // 64x64 f32: 32 registers, register-only.
            IntermediateTensor::new("s", (64, 64), 4, 1, &[Register]),
            // 64x32 f32: 16 registers, may move.
            IntermediateTensor::new("x", (64, 32), 4, 1, &[Register, Shared, Global]),
        ];
        // Everything fits: nothing moves.
        let p = place(tensors.clone(), &budget(80, 1 << 20)).unwrap();
        assert_eq!(p.registers, 80);
        assert!(p.tensors.iter().all(|t| t.tier == Register));
        // 16 too many: q (the largest movable, 16 KiB) goes, not x.
        let p = place(tensors.clone(), &budget(64, 1 << 20)).unwrap();
        assert_eq!(p.tier_of("q"), Some(Shared));
        assert_eq!(p.tier_of("x"), Some(Register));
        assert_eq!((p.registers, p.shared), (48, 16384));
        // Tighter: x too.
        let p = place(tensors.clone(), &budget(40, 1 << 20)).unwrap();
        assert_eq!(
            (p.tier_of("q"), p.tier_of("x")),
            (Some(Shared), Some(Shared))
        );
        // Shared memory overflows next: x (8 KiB) can go to global, q cannot.
        let p = place(tensors.clone(), &budget(40, 16384)).unwrap();
        assert_eq!(
            (p.tier_of("q"), p.tier_of("x")),
            (Some(Shared), Some(Global))
        );
        // Nothing left to move: rejected, naming what is stuck.
        let err = place(tensors.clone(), &budget(16, 1 << 20)).unwrap_err();
        assert!(
            err.contains("32 registers per thread needed, 16 available"),
            "{err}"
        );
        assert!(err.contains("s 64x64"), "{err}");
        let err = place(tensors, &budget(40, 8192)).unwrap_err();
        assert!(err.contains("bytes of shared memory"), "{err}");
        assert!(err.contains("q 64x128"), "{err}");
    }
}

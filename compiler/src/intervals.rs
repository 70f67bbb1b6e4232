//! Block classification of masks by interval arithmetic.
//!
//! A kernel visits (query block × key block) tiles. Evaluating the mask's
//! graph once over the *ranges* of `i` and `j` in a tile — every number an
//! interval `[lo, hi]`, every boolean the pair "can be true / can be false" —
//! says soundly whether the mask is false everywhere in the tile (**empty**:
//! skip it), true everywhere (**full**: skip the per-score predicate) or
//! neither (**partial**). Index arithmetic (causal, sliding windows,
//! bands) classifies exactly; anything read from a custom input is unknown,
//! so such masks stay partial (correct, just not faster).
//!
//! [`classify`] is the reference of the rules; `cxx::intervals` emits the
//! same rules as a device function, and the tests hold both to brute force.

use aec_frontend::ir::{Axis, Binary, DType, Op, Region, Unary};

/// What a mask is over one tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockClass {
    /// False at every point: the tile contributes nothing.
    Empty,
    /// Maybe true at some points and false at others.
    Partial,
    /// True at every point: no per-score predicate needed.
    Full,
}

/// A closed interval of reals; infinite ends mean unknown.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    pub const UNKNOWN: Interval = Interval {
        lo: f64::NEG_INFINITY,
        hi: f64::INFINITY,
    };

    pub fn point(x: f64) -> Interval {
        Interval { lo: x, hi: x }
    }

    /// Both ends through a monotone non-decreasing function.
    fn rising(self, f: impl Fn(f64) -> f64) -> Interval {
        Interval::checked(f(self.lo), f(self.hi))
    }

    /// An interval from two ends, unknown where arithmetic gave NaN.
    fn checked(lo: f64, hi: f64) -> Interval {
        if lo.is_nan() || hi.is_nan() {
            Interval::UNKNOWN
        } else {
            Interval { lo, hi }
        }
    }

    fn hull(self, o: Interval) -> Interval {
        Interval {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }

    /// The hull of four candidate ends (products, quotients).
    fn of4(c: [f64; 4]) -> Interval {
        if c.iter().any(|x| x.is_nan()) {
            return Interval::UNKNOWN;
        }
        Interval {
            lo: c.iter().cloned().fold(f64::INFINITY, f64::min),
            hi: c.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// A boolean over a tile: which values it can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truth {
    pub can_true: bool,
    pub can_false: bool,
}

const MAYBE: Truth = Truth {
    can_true: true,
    can_false: true,
};

#[derive(Clone, Copy, Debug)]
enum Val {
    Num(Interval),
    Bool(Truth),
}

/// The ranges of one tile: `i` in `[i0, i1]`, `j` in `[j0, j1]`, the other
/// index axes (batch, heads) at one value, sizes known.
#[derive(Clone, Debug)]
pub struct Tile {
    pub i: (i64, i64),
    pub j: (i64, i64),
    /// Values of the other index axes (`B`, `H`, `Hkv`).
    pub point: Vec<(Axis, i64)>,
    /// Every axis size the mask may read.
    pub sizes: Vec<(Axis, i64)>,
}

fn lookup(table: &[(Axis, i64)], a: Axis) -> Option<f64> {
    table.iter().find(|(x, _)| *x == a).map(|(_, v)| *v as f64)
}

/// Classifies the mask region (output `mask`) over a tile.
pub fn classify(mask: &Region, tile: &Tile) -> BlockClass {
    let g = &mask.graph;
    let mut vals: Vec<Val> = Vec::with_capacity(g.len());
    for id in g.ids() {
        let n = g.node(id);
        let num = |k: usize, vals: &[Val]| match vals[n.args[k].index()] {
            Val::Num(x) => x,
            Val::Bool(_) => Interval::UNKNOWN,
        };
        let truth = |k: usize, vals: &[Val]| match vals[n.args[k].index()] {
            Val::Bool(t) => t,
            Val::Num(_) => MAYBE,
        };
        let v = match n.op {
            Op::Const(c) => match n.dtype {
                DType::Bool => Val::Bool(Truth {
                    can_true: c.get() != 0.0,
                    can_false: c.get() == 0.0,
                }),
                _ => Val::Num(Interval::point(c.get())),
            },
            Op::Index(Axis::Sq) => Val::Num(Interval {
                lo: tile.i.0 as f64,
                hi: tile.i.1 as f64,
            }),
            Op::Index(Axis::Skv) => Val::Num(Interval {
                lo: tile.j.0 as f64,
                hi: tile.j.1 as f64,
            }),
            Op::Index(a) => {
                Val::Num(lookup(&tile.point, a).map_or(Interval::UNKNOWN, Interval::point))
            }
            Op::Shape(a) => {
                Val::Num(lookup(&tile.sizes, a).map_or(Interval::UNKNOWN, Interval::point))
            }
            Op::Param(_) | Op::Custom(_) | Op::Gather(_) | Op::Reduce(_) => {
                if n.dtype == DType::Bool {
                    Val::Bool(MAYBE)
                } else {
                    Val::Num(Interval::UNKNOWN)
                }
            }
            Op::Unary(Unary::Not) => {
                let t = truth(0, &vals);
                Val::Bool(Truth {
                    can_true: t.can_false,
                    can_false: t.can_true,
                })
            }
            Op::Unary(u) => Val::Num(unary(u, num(0, &vals))),
            Op::Binary(b) if b.is_logical() => {
                let (x, y) = (truth(0, &vals), truth(1, &vals));
                Val::Bool(match b {
                    Binary::And => Truth {
                        can_true: x.can_true && y.can_true,
                        can_false: x.can_false || y.can_false,
                    },
                    _ => Truth {
                        can_true: x.can_true || y.can_true,
                        can_false: x.can_false && y.can_false,
                    },
                })
            }
            Op::Binary(b) if b.is_comparison() => {
                Val::Bool(compare(b, num(0, &vals), num(1, &vals)))
            }
            Op::Binary(b) => Val::Num(arith(b, num(0, &vals), num(1, &vals))),
            Op::Select => {
                let c = truth(0, &vals);
                let pick = |k: usize| vals[n.args[k].index()];
                match (c.can_true, c.can_false) {
                    (true, false) => pick(1),
                    (false, true) => pick(2),
                    _ => match (pick(1), pick(2)) {
                        (Val::Num(x), Val::Num(y)) => Val::Num(x.hull(y)),
                        (Val::Bool(x), Val::Bool(y)) => Val::Bool(Truth {
                            can_true: x.can_true || y.can_true,
                            can_false: x.can_false || y.can_false,
                        }),
                        _ => Val::Bool(MAYBE),
                    },
                }
            }
        };
        vals.push(v);
    }
    let out = mask.output("mask").expect("mask region has `mask`");
    match vals[out.index()] {
        Val::Bool(t) if !t.can_true => BlockClass::Empty,
        Val::Bool(t) if !t.can_false => BlockClass::Full,
        _ => BlockClass::Partial,
    }
}

fn unary(u: Unary, x: Interval) -> Interval {
    match u {
        Unary::Neg => Interval {
            lo: -x.hi,
            hi: -x.lo,
        },
        Unary::Exp | Unary::Exp2 | Unary::Tanh | Unary::Sigmoid | Unary::Relu | Unary::Sign => {
            x.rising(|v| u.apply(v))
        }
        Unary::Log | Unary::Log2 | Unary::Sqrt if x.lo >= 0.0 => x.rising(|v| u.apply(v)),
        Unary::Rsqrt if x.lo > 0.0 => Interval::checked(u.apply(x.hi), u.apply(x.lo)),
        Unary::Abs if x.lo >= 0.0 => x,
        Unary::Abs if x.hi <= 0.0 => Interval {
            lo: -x.hi,
            hi: -x.lo,
        },
        Unary::Abs => Interval {
            lo: 0.0,
            hi: (-x.lo).max(x.hi),
        },
        _ => Interval::UNKNOWN,
    }
}

fn arith(b: Binary, x: Interval, y: Interval) -> Interval {
    match b {
        Binary::Add => Interval::checked(x.lo + y.lo, x.hi + y.hi),
        Binary::Sub => Interval::checked(x.lo - y.hi, x.hi - y.lo),
        Binary::Mul => Interval::of4([x.lo * y.lo, x.lo * y.hi, x.hi * y.lo, x.hi * y.hi]),
        Binary::Div if y.lo > 0.0 || y.hi < 0.0 => {
            Interval::of4([x.lo / y.lo, x.lo / y.hi, x.hi / y.lo, x.hi / y.hi])
        }
        Binary::Max => Interval {
            lo: x.lo.max(y.lo),
            hi: x.hi.max(y.hi),
        },
        Binary::Min => Interval {
            lo: x.lo.min(y.lo),
            hi: x.hi.min(y.hi),
        },
        _ => Interval::UNKNOWN,
    }
}

fn compare(b: Binary, x: Interval, y: Interval) -> Truth {
    match b {
        Binary::Lt => Truth {
            can_true: x.lo < y.hi,
            can_false: x.hi >= y.lo,
        },
        Binary::Le => Truth {
            can_true: x.lo <= y.hi,
            can_false: x.hi > y.lo,
        },
        Binary::Gt => compare(Binary::Lt, y, x),
        Binary::Ge => compare(Binary::Le, y, x),
        Binary::Eq => Truth {
            can_true: x.lo <= y.hi && y.lo <= x.hi,
            can_false: !(x.lo == x.hi && y.lo == y.hi && x.lo == y.lo),
        },
        _ => {
            let t = compare(Binary::Eq, x, y);
            Truth {
                can_true: t.can_false,
                can_false: t.can_true,
            }
        }
    }
}

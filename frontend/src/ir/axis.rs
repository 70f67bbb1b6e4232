//! Named axes and sets of them.
//!
//! Every value in a traced closure varies over a set of named axes: `q` over
//! `[B, H, Sq, Dqk]`, the index variable `j` over `Skv`, a constant over none.
//! Row reductions remove the reduction axis of their pattern (`Skv`).

use serde::Serialize;
use std::fmt;

/// A named axis of the attention problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Axis {
    /// Batch.
    B,
    /// Query heads.
    H,
    /// Key/value heads (grouped-query attention); equal to `H` for plain multi-head.
    Hkv,
    /// Query sequence (parallel pattern).
    Sq,
    /// Key/value sequence (parallel pattern); the axis row reductions run over.
    Skv,
    /// Sequence (recurrent pattern).
    S,
    /// Query/key head dimension (parallel pattern).
    Dqk,
    /// Query/key head dimension (recurrent pattern).
    Dk,
    /// Value head dimension.
    Dv,
}

impl Axis {
    pub const ALL: [Axis; 9] = [
        Axis::B,
        Axis::H,
        Axis::Hkv,
        Axis::Sq,
        Axis::Skv,
        Axis::S,
        Axis::Dqk,
        Axis::Dk,
        Axis::Dv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Axis::B => "B",
            Axis::H => "H",
            Axis::Hkv => "Hkv",
            Axis::Sq => "Sq",
            Axis::Skv => "Skv",
            Axis::S => "S",
            Axis::Dqk => "Dqk",
            Axis::Dk => "Dk",
            Axis::Dv => "Dv",
        }
    }

    pub fn from_name(name: &str) -> Option<Axis> {
        Axis::ALL.into_iter().find(|a| a.name() == name)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of axes, kept in the canonical order of [`Axis::ALL`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AxisSet(u16);

impl AxisSet {
    pub const EMPTY: AxisSet = AxisSet(0);

    pub fn of(axes: &[Axis]) -> AxisSet {
        AxisSet(axes.iter().fold(0, |acc, a| acc | a.bit()))
    }

    pub fn contains(self, axis: Axis) -> bool {
        self.0 & axis.bit() != 0
    }

    pub fn union(self, other: AxisSet) -> AxisSet {
        AxisSet(self.0 | other.0)
    }

    pub fn without(self, axis: Axis) -> AxisSet {
        AxisSet(self.0 & !axis.bit())
    }

    pub fn is_subset(self, other: AxisSet) -> bool {
        self.0 & !other.0 == 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Axis> {
        Axis::ALL.into_iter().filter(move |a| self.contains(*a))
    }

    /// Axes of `self` that are not in `other`.
    pub fn minus(self, other: AxisSet) -> AxisSet {
        AxisSet(self.0 & !other.0)
    }
}

impl fmt::Debug for AxisSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for AxisSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (n, a) in self.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            f.write_str(a.name())?;
        }
        f.write_str("]")
    }
}

impl Serialize for AxisSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Axis::name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let qs = AxisSet::of(&[Axis::B, Axis::H, Axis::Sq, Axis::Skv]);
        assert!(qs.contains(Axis::Skv));
        assert!(!qs.without(Axis::Skv).contains(Axis::Skv));
        assert!(AxisSet::of(&[Axis::H]).is_subset(qs));
        assert!(!AxisSet::of(&[Axis::Dv]).is_subset(qs));
        assert_eq!(qs.to_string(), "[B, H, Sq, Skv]");
        assert_eq!(Axis::from_name("Hkv"), Some(Axis::Hkv));
        assert_eq!(Axis::from_name("F"), None);
    }
}

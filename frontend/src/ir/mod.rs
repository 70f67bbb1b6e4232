//! The graph IR: named axes, operations, the hash-consing graph and regions.

pub mod axis;
pub mod graph;
pub mod op;
pub mod region;

pub use axis::{Axis, AxisSet};
pub use graph::{Fold, Graph, Node, NodeId};
pub use op::{Binary, DType, Op, Reduce, Unary};
pub use region::{Output, Param, ParamRole, Region};

//! C++ emission shared by the CUDA and HIP templates: spellings of the IR's
//! operations, expression generation, the user's closures as device
//! functions, the mask's tile classification and the forward's online
//! regions. Target differences stay out of here: they live in each target's
//! dialect module and template prelude, which define the helpers these
//! pieces call.

pub mod closures;
pub mod expr;
pub mod intervals;
pub mod regions;
pub mod spelling;

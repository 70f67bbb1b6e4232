//! Compile-fail tests for the `attention!` macro: each `tests/ui/*.rs` case
//! holds exactly one DSL error, and its `.stderr` snapshot pins the message,
//! the help line and the span (which must be the user's offending token, not
//! the macro call site).
//!
//! Regenerate the snapshots with `TRYBUILD=overwrite cargo test --test macro_errors`
//! and read every changed `.stderr` before committing it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

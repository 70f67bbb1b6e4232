//! Valid Rust, but no `attention!` in it (tests/cli.rs).

fn main() {
    println!("hello");
}

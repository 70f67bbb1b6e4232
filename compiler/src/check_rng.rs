//! The deterministic generator of the compiler's numerical checks (the
//! split-KV combine, masked keys as −∞, the held maximum): their answers
//! must not depend on a seed source or the run.

/// Uniform values in [0, 1) from an xorshift64 state started at `seed`
/// (nonzero).
pub(crate) fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

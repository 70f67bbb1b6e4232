//! A 128-bit FNV-1a hash for cache keys and entry checksums: no dependency,
//! stable across Rust versions and platforms (unlike `std`'s hashers), and
//! cache keys are not adversarial, so no cryptographic hash is needed.

const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// Incremental FNV-1a (128 bit).
#[derive(Debug, Clone)]
pub(crate) struct Fnv128(u128);

impl Fnv128 {
    pub(crate) fn new() -> Self {
        Fnv128(OFFSET)
    }

    pub(crate) fn bytes(&mut self, data: &[u8]) -> &mut Self {
        for &b in data {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
        self
    }

    /// A length-prefixed field, so that ("ab", "c") and ("a", "bc") differ.
    pub(crate) fn field(&mut self, data: &[u8]) -> &mut Self {
        self.bytes(&(data.len() as u64).to_le_bytes()).bytes(data)
    }

    pub(crate) fn finish(&self) -> u128 {
        self.0
    }
}

pub(crate) fn fnv128(data: &[u8]) -> u128 {
    Fnv128::new().bytes(data).finish()
}

/// A hex digest (FNV-1a, 128 bit) of `data`: stable across runs, versions
/// and platforms; for keys (tuning cache, variants), not for security.
pub fn hex_digest(data: &[u8]) -> String {
    format!("{:032x}", Fnv128::new().bytes(data).finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // Reference values of FNV-1a 128 (from the FNV authors' test suite).
        assert_eq!(fnv128(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv128(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn fields_are_delimited() {
        let ab_c = Fnv128::new().field(b"ab").field(b"c").finish();
        let a_bc = Fnv128::new().field(b"a").field(b"bc").finish();
        assert_ne!(ab_c, a_bc);
    }
}

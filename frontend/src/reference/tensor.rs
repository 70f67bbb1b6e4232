//! A dense row-major f64 tensor for the reference interpreter.

use std::fmt;

#[derive(Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
        }
    }

    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Tensor {
        let mut data = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |idx| data.push(f(idx)));
        Tensor {
            shape: shape.to_vec(),
            data,
        }
    }

    /// The same shape with `f` applied to every element.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Tensor {
        Tensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }

    pub fn offset(&self, idx: &[usize]) -> usize {
        debug_assert_eq!(idx.len(), self.shape.len());
        idx.iter().zip(&self.shape).fold(0, |acc, (&i, &n)| {
            debug_assert!(i < n);
            acc * n + i
        })
    }

    pub fn get(&self, idx: &[usize]) -> f64 {
        self.data[self.offset(idx)]
    }

    pub fn set(&mut self, idx: &[usize], v: f64) {
        let o = self.offset(idx);
        self.data[o] = v;
    }

    pub fn add(&mut self, idx: &[usize], v: f64) {
        let o = self.offset(idx);
        self.data[o] += v;
    }

    pub fn norm(&self) -> f64 {
        self.data.iter().map(|x| x * x).sum::<f64>().sqrt()
    }

    /// ‖self − other‖ / ‖other‖ (or the absolute norm when `other` is zero).
    pub fn rel_err(&self, other: &Tensor) -> f64 {
        assert_eq!(
            self.shape, other.shape,
            "rel_err of tensors with different shapes"
        );
        let diff: f64 = self
            .data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>()
            .sqrt();
        let n = other.norm();
        if n == 0.0 { diff } else { diff / n }
    }
}

/// Calls `f` on every index of `shape`, in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let count: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..count {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor{:?}", self.shape)?;
        if self.data.len() <= 16 {
            write!(f, " {:?}", self.data)?;
        }
        Ok(())
    }
}

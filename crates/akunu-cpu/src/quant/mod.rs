//! Quantized matrix products: `out[t][r] = Σ_k W[r][k]·x[t][k]` for GGUF weight matrices.
//!
//! Shapes: `W` is (rows, k) in its GGUF type, row-major; `x` is (m, k) `f32`, prepared once into
//! [`Activations`]; `out` is (m, rows) with a row stride `ldo ≥ rows`.
//!
//! Plan:
//! - Activations are quantized to int8 in blocks of 32: as ggml's Q8_0 for the 32-element
//!   types, with an `f32` scale for the k-quants and IQ4_XS (ggml's Q8_K, one scale per 256,
//!   loses too much on models with outlier channels), keeping per group the scale and the
//!   scaled level sum (`act`).
//! - Every weight block decodes to unsigned levels with `w = sw·q + c` per group (`decode`), so
//!   one unsigned×signed byte product serves every type.
//! - Large `m` (`gemm`): 16 weight rows are decoded once into a panel interleaved four bytes
//!   per row, so that one `vpdpbusd` with a broadcast activation word advances 16 rows; tiles of
//!   16 rows × 8 tokens accumulate in registers and convert to `f32` once per group.
//! - Small `m` (`fused`): the hot types (Q8_0, Q5_0, Q4_K, Q6_K) have one-pass row dots that
//!   unpack a block in registers and stream the weights at memory speed; other types use `gemm`.
//! - `portable`: decode a block once, dot it with every token; plain Rust for any target.
//! - Work is split over the current rayon pool by panels or row chunks; every task writes its
//!   own rows of `out`.
//!
//! Batch invariance: at a given [`SimdLevel`], the output of a (row, token) pair is the same to
//! the bit whatever else is in the product (how many tokens, which, in which order) and however
//! rows are split over threads, so that a server batching many users' tokens into one pass gives
//! each the logits it would get alone. Every kernel of a level computes a pair by itself in one
//! fixed order:
//! - per group, the integer `Σ(q − OFF)·x`, exact (in `i32`, and in `f32` below 2²⁴), however a
//!   kernel forms it;
//! - x86 levels: group `g` of 32-element chunk `c` goes to accumulator `c mod 8` (`SLOTS`):
//!   `acc = fma(Σ(q − OFF)·x, sw·sx, acc)`, then `acc = fma(mw, s, acc)` for the formats with a
//!   min, in group order within an accumulator; the result is `a0 + a1 + … + a7`, added in
//!   that order. `gemm` holds a row per lane and goes through the accumulators one after the
//!   other; `fused` holds an accumulator per lane and reduces the products of eight chunks at a
//!   time to one vector with exact integer additions.
//!   The eight accumulators are what lets a row kernel stream: with one, each row would wait on
//!   a chain of dependent multiply-adds;
//! - portable: one accumulator in group order, `acc += sw·sx·Σ`, then `acc += mw·s`;
//! - float weights: each row widened once, then the same lane-wise dot for every token.
//!
//! Activations are quantized row by row ([`Activations`]), so they do not depend on the batch
//! either. Levels differ from each other in the last bits (fused multiply-adds or not).

mod act;
mod decode;
mod float;
// The AVX-512 intrinsics (and `vpdpbusd` in 256-bit form) are stable since Rust 1.89.
#[cfg(target_arch = "x86_64")]
mod fused;
#[cfg(target_arch = "x86_64")]
mod gemm;
mod portable;
mod simd;

use std::ops::Range;

use akunu_quant::{GgmlType, QuantError};

pub use act::Activations;
pub use simd::{simd_level, SimdLevel};

use act::Prepared;
use decode::{act_layout, with_format, Format};

/// Accumulators per (row, token) in the x86 kernels: group sums go to accumulator
/// `chunk mod 8` of their 32-element chunk, and the eight are added in order at the end (see
/// the plan above).
const SLOTS: usize = 8;

/// Why a product was refused. Nothing is written to the output in that case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatmulError {
    /// No kernel for the weight type.
    #[error("matmul: unsupported weight type {0}")]
    Unsupported(GgmlType),
    /// The row length is not a whole number of blocks.
    #[error("matmul: {cols} columns is not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        ty: GgmlType,
        cols: usize,
        block: usize,
    },
    /// The weight bytes do not match the shape.
    #[error(
        "matmul: {rows}x{cols} {ty} weights take {expected} bytes, but the buffer has {actual}"
    )]
    Length {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: u128,
        actual: usize,
    },
    /// The activations have a different row length than the weights.
    #[error("matmul: activations have {act} columns, {ty} weights {cols}")]
    Cols {
        ty: GgmlType,
        cols: usize,
        act: usize,
    },
    /// The activations were prepared for a type with a different activation format, or never.
    #[error("matmul: activations were not prepared for {0} weights")]
    Prepared(GgmlType),
    /// The output slice or stride cannot hold `m` rows of `rows` values.
    #[error("matmul: output of {len} values with stride {ldo} cannot hold {m}x{rows}")]
    Output {
        m: usize,
        rows: usize,
        ldo: usize,
        len: usize,
    },
    /// The requested SIMD level does not run on this CPU.
    #[error("matmul: SIMD level {0} is not available on this CPU")]
    Level(SimdLevel),
    /// Reference dequantization refused the row.
    #[error("matmul: {0}")]
    Dequantize(#[from] QuantError),
}

/// A row-major quantized weight matrix as stored in GGUF: `rows` output features of `cols`
/// elements (GGUF `ne0 = cols`), row `r` at byte `r·row_bytes`. Borrowed, at any alignment.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    ty: GgmlType,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl<'a> WeightMatrix<'a> {
    /// Checks that `ty` has a kernel, that `cols` is a whole number of blocks and that `data`
    /// holds exactly `rows` rows.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, MatmulError> {
        if !is_float(ty) && act_layout(ty).is_none() {
            return Err(MatmulError::Unsupported(ty));
        }
        let block = ty.block_size();
        if !cols.is_multiple_of(block) {
            return Err(MatmulError::PartialBlock { ty, cols, block });
        }
        let row_bytes = cols / block * ty.type_size();
        let expected = row_bytes as u128 * rows as u128;
        if expected != data.len() as u128 {
            return Err(MatmulError::Length {
                ty,
                rows,
                cols,
                expected,
                actual: data.len(),
            });
        }
        Ok(Self {
            ty,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// The element type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Whether weights of types `a` and `b` multiply the same prepared activations.
pub fn share_activations(a: GgmlType, b: GgmlType) -> bool {
    Activations::layout(a) == Activations::layout(b)
}

/// `out[t·ldo + r] = dot(weight row r, activation row t)` for `t < m`, `r < rows`, on the current
/// rayon pool with the kernels of [`SimdLevel::current`].
pub fn matmul(
    w: &WeightMatrix,
    x: &Activations,
    out: &mut [f32],
    ldo: usize,
) -> Result<(), MatmulError> {
    matmul_with(SimdLevel::current(), w, x, out, ldo)
}

/// [`matmul`] with the kernels of `level` (for tests and benchmarks).
pub fn matmul_with(
    level: SimdLevel,
    w: &WeightMatrix,
    x: &Activations,
    out: &mut [f32],
    ldo: usize,
) -> Result<(), MatmulError> {
    if !level.is_available() {
        return Err(MatmulError::Level(level));
    }
    let (m, rows) = (x.m, w.rows);
    if x.k != w.cols {
        return Err(MatmulError::Cols {
            ty: w.ty,
            cols: w.cols,
            act: x.k,
        });
    }
    let want = if is_float(w.ty) {
        Some(Prepared::Float)
    } else {
        act_layout(w.ty).map(|(format, group)| Prepared::Quant { format, group })
    };
    if x.prepared.is_none() || x.prepared != want {
        return Err(MatmulError::Prepared(w.ty));
    }
    let fits = m == 0
        || (ldo >= rows
            && (m - 1)
                .checked_mul(ldo)
                .and_then(|n| n.checked_add(rows))
                .is_some_and(|n| n <= out.len()));
    if !fits {
        return Err(MatmulError::Output {
            m,
            rows,
            ldo,
            len: out.len(),
        });
    }
    if m == 0 || rows == 0 {
        return Ok(());
    }
    let out = Out::new(out, ldo);
    if is_float(w.ty) {
        float::matmul(w, x, out);
        return Ok(());
    }
    with_format!(w.ty, F => run::<F>(level, w, x, out), _ => unreachable!("checked by WeightMatrix::new"));
    Ok(())
}

fn run<F: Format>(level: SimdLevel, w: &WeightMatrix, x: &Activations, out: Out) {
    match level {
        SimdLevel::Portable => portable::matmul::<F>(w, x, out),
        #[cfg(target_arch = "x86_64")]
        _ => {
            if !fused::matmul::<F>(level, w, x, out) {
                gemm::matmul::<F>(level, w, x, out);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the portable level runs here"),
    }
}

/// Expands one row of weights to `f32` (`out.len() == cols` of the row), for embedding lookups.
pub fn dequantize_row(ty: GgmlType, row_bytes: &[u8], out: &mut [f32]) -> Result<(), MatmulError> {
    akunu_quant::dequantize(ty, row_bytes, out)?;
    Ok(())
}

/// Splits `0..n` into about `4·threads` ranges of whole `align`-sized units, so that work
/// stealing evens out the tasks.
fn split(n: usize, align: usize) -> impl Iterator<Item = Range<usize>> + Clone {
    let units = n.div_ceil(align);
    let tasks = (4 * rayon::current_num_threads()).clamp(1, units.max(1));
    let per = units.div_ceil(tasks) * align;
    (0..n.div_ceil(per)).map(move |i| i * per..((i + 1) * per).min(n))
}

/// The output matrix, shared by tasks that each write a disjoint set of rows `r`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    len: usize,
    ldo: usize,
}

// SAFETY: `Out` is only built by `matmul_with` from the `&mut [f32]` it holds for the whole
// product, and tasks write disjoint elements through it (see `Out::put`).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    fn new(out: &mut [f32], ldo: usize) -> Self {
        Self {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            ldo,
        }
    }

    /// Writes `vals` to `out[t·ldo + r0 ..]`.
    ///
    /// # Safety
    /// No other task may write the same elements during the product.
    unsafe fn put(&self, t: usize, r0: usize, vals: &[f32]) {
        let start = t * self.ldo + r0;
        assert!(start + vals.len() <= self.len, "output index out of range");
        // SAFETY: in bounds by the assertion; exclusive per the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.add(start), vals.len()) }
    }
}

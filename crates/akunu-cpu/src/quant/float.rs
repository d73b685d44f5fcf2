//! F32, F16 and BF16 weights against `f32` activations: each row is widened to `f32` once and
//! dotted with every token. Plain Rust with independent lanes, which the compiler vectorizes;
//! these types are rare in quantized models, so they share one kernel at every level. Each
//! token's dot is the same code on the same values whatever the batch, hence the same bits.

use akunu_quant::GgmlType;
use half::{bf16, f16};
use rayon::prelude::*;

use super::{split, Activations, Out, WeightMatrix};

/// Accumulator lanes; enough independent sums to fill the vector units.
const LANES: usize = 16;

pub(super) fn matmul(w: &WeightMatrix, x: &Activations, out: Out) {
    let (m, k) = (x.m, x.k);
    let ranges: Vec<_> = split(w.rows(), 1).collect();
    ranges.into_par_iter().for_each(|rows| {
        let n = rows.len();
        let mut vals = vec![0.0f32; m * n];
        let mut wf = vec![0.0f32; k];
        for (i, r) in rows.clone().enumerate() {
            widen(w.ty(), w.row(r), &mut wf);
            for (t, xt) in x.f.chunks_exact(k).enumerate() {
                vals[t * n + i] = dot(&wf, xt);
            }
        }
        for (t, v) in vals.chunks_exact(n).enumerate() {
            // SAFETY: this task owns rows `rows` of every output row.
            unsafe { out.put(t, rows.start, v) };
        }
    });
}

fn widen(ty: GgmlType, row: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => unreachable!("float weights only"),
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

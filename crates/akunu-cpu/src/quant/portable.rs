//! The portable kernel: each weight block is decoded once and dotted with every token, in plain
//! Rust that the compiler vectorizes for whatever target it builds. Every token has its own
//! accumulator, added to group after group, so its result does not depend on the batch.

use rayon::prelude::*;

use super::decode::Format;
use super::{split, Activations, Out, WeightMatrix};

/// Row chunks in parallel; within a chunk, row by row.
pub(super) fn matmul<F: Format>(w: &WeightMatrix, x: &Activations, out: Out) {
    let m = x.m;
    let ranges: Vec<_> = split(w.rows(), 1).collect();
    ranges.into_par_iter().for_each(|rows| {
        let n = rows.len();
        // vals[t·n + i] for row rows.start + i.
        let mut vals = vec![0.0f32; m * n];
        for (i, r) in rows.clone().enumerate() {
            row::<F>(w.row(r), x, |t, v| vals[t * n + i] = v);
        }
        for (t, v) in vals.chunks_exact(n).enumerate() {
            // SAFETY: this task owns rows `rows` of every output row.
            unsafe { out.put(t, rows.start, v) };
        }
    });
}

/// Dots one weight row with every activation row, reporting `(t, value)`.
fn row<F: Format>(row: &[u8], x: &Activations, mut emit: impl FnMut(usize, f32)) {
    let (m, k) = (x.m, x.k);
    let ng = k / F::GROUP;
    let per = F::BLOCK / F::GROUP;
    let mut q = [0u8; 256];
    let (mut sw, mut mw) = ([0.0f32; 16], [0.0f32; 16]);
    let mut acc = vec![0.0f32; m];
    for (b, block) in row.chunks_exact(F::BYTES).enumerate() {
        F::decode(block, &mut q, &mut sw, &mut mw);
        for (t, acc) in acc.iter_mut().enumerate() {
            let xq = &x.q[t * k + b * F::BLOCK..][..F::BLOCK];
            let sx = &x.sx[t * ng + b * per..][..per];
            let s = &x.s[t * ng + b * per..][..per];
            let xsum = &x.xsum[t * ng + b * per..][..per];
            for (g, (qg, xg)) in q[..F::BLOCK]
                .chunks_exact(F::GROUP)
                .zip(xq.chunks_exact(F::GROUP))
                .enumerate()
            {
                let isum: i32 = qg
                    .iter()
                    .zip(xg)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum();
                let centred = isum - i32::from(F::OFF) * xsum[g] as i32;
                *acc += sw[g] * sx[g] * centred as f32;
                if F::HAS_MIN {
                    *acc += mw[g] * s[g];
                }
            }
        }
    }
    for (t, v) in acc.into_iter().enumerate() {
        emit(t, v);
    }
}

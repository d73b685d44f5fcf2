//! Whole-API tests: type coverage, length and type errors, alignment, and quantize → dequantize
//! error bounds on random data.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Standard normal samples (Box–Muller), scaled.
fn normal(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u: f32 = rng.random_range(f32::EPSILON..1.0);
            let v: f32 = rng.random();
            scale * (-2.0 * u.ln()).sqrt() * (2.0 * std::f32::consts::PI * v).cos()
        })
        .collect()
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random()).collect()
}

#[test]
fn block_structs_match_type_sizes() {
    use std::mem::size_of;
    let sizes = [
        (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
        (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
        (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
        (GgmlType::Q5_1, size_of::<BlockQ5_1>()),
        (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
        (GgmlType::Q8_1, size_of::<BlockQ8_1>()),
        (GgmlType::Q2_K, size_of::<BlockQ2_K>()),
        (GgmlType::Q3_K, size_of::<BlockQ3_K>()),
        (GgmlType::Q4_K, size_of::<BlockQ4_K>()),
        (GgmlType::Q5_K, size_of::<BlockQ5_K>()),
        (GgmlType::Q6_K, size_of::<BlockQ6_K>()),
        (GgmlType::Q8_K, size_of::<BlockQ8_K>()),
        (GgmlType::IQ4_NL, size_of::<BlockIQ4_NL>()),
        (GgmlType::IQ4_XS, size_of::<BlockIQ4_XS>()),
    ];
    for (ty, size) in sizes {
        assert_eq!(ty.type_size(), size, "{ty}");
    }
}

#[test]
fn supported_types_dequantize_and_the_rest_are_refused() {
    let mut rng = StdRng::seed_from_u64(1);
    for &ty in GgmlType::ALL {
        let n = 2 * ty.block_size();
        let src = random_bytes(&mut rng, 2 * ty.type_size());
        let mut dst = vec![0.0f32; n];
        let r = dequantize(ty, &src, &mut dst);
        if ty.is_supported() {
            assert_eq!(r, Ok(()), "{ty}");
        } else {
            assert_eq!(r, Err(QuantError::Unsupported(ty)));
            assert_eq!(dst, vec![0.0; n], "{ty}: nothing written");
        }
    }
    let err = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut [0.0; 256]).unwrap_err();
    assert_eq!(err.to_string(), "unsupported tensor type IQ2_XXS");
}

#[test]
fn has_quantizer_agrees_with_quantize() {
    let mut rng = StdRng::seed_from_u64(2);
    for &ty in GgmlType::ALL {
        let x = normal(&mut rng, ty.block_size(), 1.0);
        let mut dst = vec![0u8; ty.type_size()];
        match quantize(ty, &x, &mut dst) {
            Ok(()) => assert!(has_quantizer(ty), "{ty}"),
            Err(e) => {
                assert!(!has_quantizer(ty), "{ty}: {e}");
                assert_eq!(e, QuantError::NoQuantizer(ty));
            }
        }
    }
    let err = quantize(GgmlType::I32, &[1.0], &mut [0; 4]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no reference quantizer for tensor type I32"
    );
}

#[test]
fn length_errors_are_reported_not_panicked() {
    let err = dequantize(GgmlType::Q4_K, &[0; 144], &mut [0.0; 255]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "255 elements is not a whole number of Q4_K blocks of 256"
    );
    let err = dequantize(GgmlType::Q4_0, &[0; 35], &mut [0.0; 64]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "64 elements of Q4_0 take 36 bytes, but the buffer has 35"
    );
    let err = quantize(GgmlType::Q8_0, &[0.5; 33], &mut [0; 34]).unwrap_err();
    assert!(matches!(
        err,
        QuantError::PartialBlock {
            elements: 33,
            block_size: 32,
            ..
        }
    ));
    let err = quantize(GgmlType::BF16, &[0.5; 3], &mut [0; 7]).unwrap_err();
    assert_eq!(
        err,
        QuantError::Length {
            ty: GgmlType::BF16,
            elements: 3,
            expected: 6,
            actual: 7
        }
    );
    assert_eq!(dequantize(GgmlType::Q6_K, &[], &mut []), Ok(()));
    assert_eq!(quantize(GgmlType::IQ4_XS, &[], &mut []), Ok(()));
    let mut rng = StdRng::seed_from_u64(3);
    for &ty in GgmlType::ALL.iter().filter(|t| t.is_supported()) {
        for n in [1, 31, 33, 255, 257] {
            let src = random_bytes(&mut rng, n * ty.type_size() / ty.block_size() + 1);
            let _ = dequantize(ty, &src, &mut vec![0.0; n]);
            let _ = quantize(ty, &vec![0.25; n], &mut vec![0; src.len()]);
        }
    }
}

#[test]
fn reads_blocks_at_any_alignment() {
    let mut rng = StdRng::seed_from_u64(4);
    for ty in [
        GgmlType::Q8_K,
        GgmlType::Q4_K,
        GgmlType::IQ4_XS,
        GgmlType::F32,
        GgmlType::I64,
    ] {
        let n = 2 * ty.block_size();
        let bytes = ty.type_size() * 2;
        let mut buf = random_bytes(&mut rng, bytes + 7);
        // Finite scales, so that equal results are comparable with `==`.
        let x = normal(&mut rng, n, 1.0);
        if has_quantizer(ty) {
            quantize(ty, &x, &mut buf[..bytes]).unwrap();
        }
        let mut want = vec![0.0f32; n];
        dequantize(ty, &buf[..bytes], &mut want).unwrap();
        for offset in 1..8 {
            let mut shifted = vec![0u8; bytes + 8];
            shifted[offset..offset + bytes].copy_from_slice(&buf[..bytes]);
            let mut got = vec![0.0f32; n];
            dequantize(ty, &shifted[offset..offset + bytes], &mut got).unwrap();
            assert_eq!(got, want, "{ty} at offset {offset}");
        }
    }
}

#[test]
fn plain_types_are_value_casts() {
    let mut y = [0.0f32; 3];
    dequantize(GgmlType::I8, &[0xFF, 0x80, 0x7F], &mut y).unwrap();
    assert_eq!(y, [-1.0, -128.0, 127.0]);
    let src: Vec<u8> = [-300i16, 0, 32767]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize(GgmlType::I16, &src, &mut y).unwrap();
    assert_eq!(y, [-300.0, 0.0, 32767.0]);
    // 2^24 + 1 is not an f32; it rounds to the nearest (even) neighbour.
    let src: Vec<u8> = [16_777_217i32, -5, i32::MIN]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize(GgmlType::I32, &src, &mut y).unwrap();
    assert_eq!(y, [16_777_216.0, -5.0, -2_147_483_648.0]);
    let src: Vec<u8> = [1i64 << 40, -7, i64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize(GgmlType::I64, &src, &mut y).unwrap();
    assert_eq!(y, [1_099_511_627_776.0, -7.0, 9.223_372e18]);
    let src: Vec<u8> = [0.1f64, -1e300, 3.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize(GgmlType::F64, &src, &mut y).unwrap();
    assert_eq!(y, [0.1f32, f32::NEG_INFINITY, 3.5]);
    dequantize(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B], &mut y).unwrap();
    assert_eq!(y, [1.0, -2.0, 65504.0]);
    dequantize(
        GgmlType::BF16,
        &[0x80, 0x3F, 0x49, 0x40, 0x80, 0xFF],
        &mut y,
    )
    .unwrap();
    assert_eq!(y, [1.0, 3.140625, f32::NEG_INFINITY]);
    let mut out = [0u8; 6];
    quantize(GgmlType::F16, &[1.0, -2.0, 65504.0], &mut out).unwrap();
    assert_eq!(out, [0x00, 0x3C, 0x00, 0xC0, 0xFF, 0x7B]);
}

/// Relative RMS error (`‖x − x̂‖ / ‖x‖`) of a quantize → dequantize round trip.
fn round_trip_error(ty: GgmlType, x: &[f32]) -> f32 {
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (err / norm).sqrt() as f32
}

#[test]
fn round_trip_error_is_within_each_formats_precision() {
    // Bounds sit about 15% above what ggml's quantizers reach on Gaussian data (the relative
    // RMS error is scale-free); a broken packing or scale is off by far more.
    let bounds = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 2.5e-4),
        (GgmlType::BF16, 2e-3),
        (GgmlType::Q8_0, 6.5e-3),
        (GgmlType::Q8_1, 6.5e-3),
        (GgmlType::Q8_K, 8e-3),
        (GgmlType::Q6_K, 0.023),
        (GgmlType::Q5_0, 0.05),
        (GgmlType::Q5_1, 0.044),
        (GgmlType::Q5_K, 0.042),
        (GgmlType::Q4_0, 0.1),
        (GgmlType::Q4_1, 0.09),
        (GgmlType::Q4_K, 0.083),
        (GgmlType::IQ4_NL, 0.09),
        (GgmlType::IQ4_XS, 0.09),
        (GgmlType::Q3_K, 0.175),
        (GgmlType::Q2_K, 0.34),
    ];
    let mut rng = StdRng::seed_from_u64(5);
    for scale in [1e-3f32, 0.05, 3.0] {
        let x = normal(&mut rng, 64 * QK_K, scale);
        for (ty, bound) in bounds {
            let err = round_trip_error(ty, &x);
            assert!(
                err <= bound,
                "{ty} at scale {scale}: relative error {err} > {bound}"
            );
        }
    }
}

#[test]
fn q8_0_round_trip_is_within_half_a_step_per_element() {
    let mut rng = StdRng::seed_from_u64(6);
    let x = normal(&mut rng, 32 * 64, 0.7);
    let mut q = vec![0u8; 34 * 64];
    quantize(GgmlType::Q8_0, &x, &mut q).unwrap();
    let mut y = vec![0.0f32; x.len()];
    dequantize(GgmlType::Q8_0, &q, &mut y).unwrap();
    for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // The f16 scale adds a relative error of at most 2^-11 on top of half a step.
        let step = amax / 127.0;
        for (v, w) in xs.iter().zip(ys) {
            assert!(
                (v - w).abs() <= step * 0.5 + amax * 1e-3,
                "block {b}: {v} vs {w}"
            );
        }
    }
}

#[test]
fn quantizers_survive_non_finite_input() {
    let mut x = vec![0.5f32; QK_K];
    x[3] = f32::NAN;
    x[100] = f32::INFINITY;
    x[200] = -f32::MAX;
    for &ty in GgmlType::ALL.iter().filter(|t| has_quantizer(**t)) {
        let mut q = vec![0u8; ty.bytes_for(QK_K as u64).unwrap() as usize];
        quantize(ty, &x, &mut q).unwrap();
    }
}

//! Bit-for-bit comparison with ggml itself (through libggml-base.so) and with the `gguf` Python
//! package, on the data `scripts/ref/quant_fixtures.py` writes to `$AKUNU_REFDATA/quant` (see
//! that script for the file layout).

use std::path::Path;

use akunu_quant::{dequantize, quantize, GgmlType};
use serde_json::Value;

fn read(dir: &Path, file: &str) -> Vec<u8> {
    let path = dir.join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_f32(dir: &Path, file: &str) -> Vec<f32> {
    read(dir, file)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Describes the first element whose bits differ, or `None` when all match.
fn first_f32_difference(ty: GgmlType, got: &[f32], want: &[f32]) -> Option<String> {
    assert_eq!(got.len(), want.len());
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())?;
    let block = ty.block_size();
    let count = got
        .iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    Some(format!(
        "block {} element {}: got {:e} ({:#010x}), want {:e} ({:#010x}); {count} of {} differ",
        i / block,
        i % block,
        got[i],
        got[i].to_bits(),
        want[i],
        want[i].to_bits(),
        got.len()
    ))
}

/// Describes the first block whose bytes differ, or `None` when all match.
fn first_block_difference(ty: GgmlType, got: &[u8], want: &[u8]) -> Option<String> {
    assert_eq!(got.len(), want.len());
    let size = ty.type_size();
    let i = got.iter().zip(want).position(|(a, b)| a != b)?;
    let block = i / size;
    let count = got
        .chunks_exact(size)
        .zip(want.chunks_exact(size))
        .filter(|(a, b)| a != b)
        .count();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let range = block * size..(block + 1) * size;
    Some(format!(
        "block {block} byte {}: got {}, want {}; {count} of {} blocks differ",
        i % size,
        hex(&got[range.clone()]),
        hex(&want[range]),
        got.len() / size
    ))
}

#[test]
fn dequantize_and_quantize_match_ggml_bit_for_bit() {
    let Some(dir) = akunu_testutil::refdata("quant") else {
        return;
    };
    let manifest: Value = serde_json::from_slice(&read(&dir, "manifest.json")).unwrap();
    let types = manifest["types"].as_object().expect("manifest lists types");
    let mut failures = Vec::new();
    let mut checked = Vec::new();

    for (name, entry) in types {
        let ty_name = entry["type"].as_str().unwrap();
        let ty = GgmlType::from_name(ty_name).unwrap_or_else(|| panic!("unknown type {ty_name}"));
        assert_eq!(
            entry["type_size"].as_u64(),
            Some(ty.type_size() as u64),
            "{ty} block bytes"
        );
        assert_eq!(
            entry["block_size"].as_u64(),
            Some(ty.block_size() as u64),
            "{ty} block size"
        );

        let blocks = read(&dir, &format!("{name}.blocks.bin"));
        let mut got = vec![0.0f32; entry["dequant"]["elements"].as_u64().unwrap() as usize];
        dequantize(ty, &blocks, &mut got).unwrap();
        let want = read_f32(&dir, &format!("{name}.dequant.f32"));
        if let Some(d) = first_f32_difference(ty, &got, &want) {
            failures.push(format!("{ty} dequantize vs ggml: {d}"));
        }
        let alt = entry["dequant"]["alt"].as_str().unwrap();
        let want = read_f32(&dir, &format!("{name}.dequant_alt.f32"));
        if let Some(d) = first_f32_difference(ty, &got, &want) {
            failures.push(format!("{ty} dequantize vs {alt}: {d}"));
        }

        let x = read_f32(&dir, &format!("{name}.qin.f32"));
        let want = read(&dir, &format!("{name}.qout.bin"));
        let mut got = vec![0u8; want.len()];
        quantize(ty, &x, &mut got).unwrap();
        if let Some(d) = first_block_difference(ty, &got, &want) {
            failures.push(format!("{ty} quantize vs ggml: {d}"));
        }
        if !entry["quantize"]["gguf"].is_null() {
            // gguf-py is a second, independent oracle. Where it and ggml disagree (the sign of the
            // zero scale or minimum of an all-zero block, F16 NaN payloads) ggml decides;
            // elsewhere all three must agree.
            let py = read(&dir, &format!("{name}.qout_gguf.bin"));
            let size = ty.type_size();
            let (mut compared, mut exempt) = (0, 0);
            for (i, ((g, w), p)) in got
                .chunks_exact(size)
                .zip(want.chunks_exact(size))
                .zip(py.chunks_exact(size))
                .enumerate()
            {
                if w != p {
                    exempt += 1;
                } else if g != p {
                    failures.push(format!("{ty} quantize vs gguf-py: block {i} differs"));
                    break;
                } else {
                    compared += 1;
                }
            }
            eprintln!(
                "{ty}: {compared} blocks also match gguf-py, {exempt} where it differs from ggml"
            );
        }
        checked.push(ty_name.to_string());
    }

    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
    for required in [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    ] {
        assert!(
            checked.iter().any(|t| t == required),
            "{required} missing from the fixtures"
        );
    }
    for required in ["Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "F16", "BF16"] {
        assert!(
            checked.iter().any(|t| t == required),
            "{required} missing from the fixtures"
        );
    }
}

//! Quantized weights on the device, the batched matrix-vector products of decode (m ≤ 16
//! tokens) and the embedding lookup.
//!
//! Plan:
//! - [`DeviceMatrix::upload`] keeps a weight quantized in ggml's block format, split into two
//!   planes so that the bulk of every block is 16-byte aligned (the quants, then the scales and
//!   other small fields; `kernels/quant.cuh` documents the layout per type). Its
//!   [`DeviceMatrix::args`] are what every kernel over a matrix takes first, so the tiled GEMM
//!   reads the same layout through `dequant32`.
//! - [`ActScratch::prepare`] quantizes an input once to int8 per 32 values with per-group
//!   scales and level sums (the `q8_1` idea, `kernels/actq.cuh`), and every product of that
//!   input (q, k and v; gate and up) reuses it. In decode the fused residual add + RMSNorm,
//!   the lookup with the first norm and the attention write that form themselves
//!   ([`ActScratch::written_by`]), so the products after them launch no quantizer.
//! - [`gemv_residual_norm`] is the single-token product that closes a decoder block with the
//!   residual add and the next RMSNorm folded in: it leaves the norm's input undivided by the
//!   RMS, with per-group sums of squares, and the products that read it apply the factor to
//!   their sums, so decode launches no norm between blocks.
//! - [`gemv`] multiplies with `__dp4a` (four int8 products per instruction) so that one weight
//!   read serves all m tokens at the speed of memory; F32, F16 and BF16 weights use the f32
//!   inputs. Batches of 5 to 16 tokens over Q4_0, Q4_K and Q6_K rows (a multiple of 128
//!   values), and of 3 or 4 over the layers' matrices, run on tensor cores instead (`mma.sync`
//!   int8, a k-step per run of values with one scale, the chip config's `gemv_mma_from` and
//!   `gemv_mma_small_from`; 16 or 32 rows a block by the launch's size),
//!   where the `dp4a` products are bound by their dot products and repeated activation loads.
//!   [`gemv_many`] runs up to three products of one input (q, k and v) in one launch, so the
//!   small ones do not each pay a launch and a ramp.
//!   [`gemv_gated`] computes `act(gate·x) * (up·x)` in one launch; [`gemv_argmax`] finds
//!   the largest output of a greedy decode step's output product in the same launch.
//!   [`embed`] gathers dequantized rows; [`embed_norm`] also applies the first RMSNorm and
//!   writes its int8 form, so a pass starts with one launch before its first products.
//! - A launch gives each row group (one warp's rows) several warps, each taking a share of the
//!   row's columns, when its matrices have too few rows to fill the GPU (see `ksplit`).
//! - The products of one and two tokens with unsplit rows run on a grid capped at what the GPU
//!   holds at once ([`GridCap`]): each warp walks several row groups and keeps its weight loads
//!   in flight from one to the next.
//! - [`MatmulKernels`] resolves every kernel of the weight types in use once; launches only pass
//!   pointers and sizes, so they can be captured in a CUDA graph.

use std::sync::Arc;

use akunu_core::Activation;
use akunu_quant::GgmlType;
use bytemuck::{Pod, Zeroable};

use crate::compile::ModuleSpec;
use crate::gpu::{Arg, DeviceBuffer, Gpu, Kernel};
use crate::sample::Chain;
use crate::CudaError;

/// The weight types the kernels handle.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// Whether matrices of type `ty` can be uploaded and multiplied.
pub fn supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// The largest batch the products take.
pub const MAX_M: usize = 16;

/// Batch sizes with a kernel of their own; a batch runs in the smallest one that holds it.
const M_VARIANTS: [usize; 5] = [1, 2, 4, 8, 16];

/// Values per activation group (one scale and level sum each).
const GROUP: usize = 32;

/// Where each ggml block's bytes go: `data` ranges are concatenated into the block's
/// `data_bytes` in the data plane; `aux` ranges `(src, dst, len)` land in its `aux_bytes` of
/// the aux plane (gaps stay zero); `aux2`, if any, goes to a second aux plane after the first.
struct Layout {
    data: &'static [(usize, usize)],
    data_bytes: usize,
    aux: &'static [(usize, usize, usize)],
    aux_bytes: usize,
    aux2: Option<(usize, usize)>,
}

/// The device layout of a quantized type (matching `kernels/quant.cuh`); `None` for the float
/// types, which are stored as they are.
fn layout(ty: GgmlType) -> Option<Layout> {
    use GgmlType as T;
    let l = |data, data_bytes, aux, aux_bytes| Layout {
        data,
        data_bytes,
        aux,
        aux_bytes,
        aux2: None,
    };
    Some(match ty {
        T::Q4_0 | T::IQ4_NL => l(&[(2, 16)], 16, &[(0, 0, 2)], 2),
        T::Q4_1 => l(&[(4, 16)], 16, &[(0, 0, 4)], 4),
        T::Q5_0 => l(&[(6, 16)], 16, &[(0, 0, 2), (2, 4, 4)], 8),
        T::Q5_1 => l(&[(8, 16)], 16, &[(0, 0, 8)], 8),
        T::Q8_0 => l(&[(2, 32)], 32, &[(0, 0, 2)], 2),
        T::Q2_K => l(&[(0, 80)], 80, &[(80, 0, 4)], 4),
        T::Q3_K => l(&[(0, 96)], 96, &[(96, 0, 14)], 16),
        T::Q4_K => l(&[(16, 128)], 128, &[(0, 0, 16)], 16),
        T::Q5_K => l(&[(16, 160)], 160, &[(0, 0, 16)], 16),
        T::Q6_K => Layout {
            data: &[(0, 192)],
            data_bytes: 192,
            aux: &[(192, 0, 16)],
            aux_bytes: 16,
            aux2: Some((208, 2)),
        },
        T::IQ4_XS => l(&[(8, 128)], 128, &[(0, 0, 8)], 8),
        _ => return None,
    })
}

/// The aux plane starts at this alignment within the matrix's buffer.
const PLANE_ALIGN: usize = 256;

/// A weight matrix on the device: `rows` rows of `cols` elements of type `ty`.
pub struct DeviceMatrix {
    buf: DeviceBuffer,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Byte offset of the aux plane in `buf` (0 when there is none).
    aux_offset: usize,
    has_aux: bool,
}

impl DeviceMatrix {
    /// Uploads a matrix given in ggml's format (`rows` rows of `cols / block_size` blocks).
    ///
    /// Fails with [`CudaError::Unsupported`] for types without kernels or when `cols` is not a
    /// multiple of 32 (or of the block size), and with [`CudaError::Bounds`] when `bytes` is
    /// not exactly the matrix's size.
    pub fn upload(
        gpu: &Gpu,
        ty: GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DeviceMatrix, CudaError> {
        if !supported(ty) {
            return Err(CudaError::Unsupported(format!(
                "no CUDA kernels for {ty} matrices"
            )));
        }
        let block = ty.block_size();
        if cols == 0 || rows == 0 || !cols.is_multiple_of(GROUP) || !cols.is_multiple_of(block) {
            return Err(CudaError::Unsupported(format!(
                "a {rows}x{cols} {ty} matrix: rows and cols must be positive, cols a multiple of \
                 {}",
                GROUP.max(block)
            )));
        }
        if rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(CudaError::Unsupported(format!(
                "a {rows}x{cols} matrix is too large for the kernels"
            )));
        }
        let blocks = rows
            .checked_mul(cols / block)
            .ok_or_else(|| CudaError::Bounds(format!("a {rows}x{cols} matrix is too large")))?;
        let expected = blocks.checked_mul(ty.type_size());
        if expected != Some(bytes.len()) {
            return Err(CudaError::Bounds(format!(
                "a {rows}x{cols} {ty} matrix takes {} bytes, got {}",
                expected.map_or("too many".into(), |n| n.to_string()),
                bytes.len()
            )));
        }
        let Some(l) = layout(ty) else {
            let buf = gpu.upload(bytes)?;
            return Ok(DeviceMatrix {
                buf,
                ty,
                rows,
                cols,
                aux_offset: 0,
                has_aux: false,
            });
        };
        let (data, aux) = repack(&l, ty.type_size(), bytes, blocks);
        let aux_offset = data.len().next_multiple_of(PLANE_ALIGN);
        let buf = gpu.alloc(aux_offset + aux.len())?;
        gpu.write(&buf, 0, &data)?;
        gpu.write(&buf, aux_offset, &aux)?;
        Ok(DeviceMatrix {
            buf,
            ty,
            rows,
            cols,
            aux_offset,
            has_aux: true,
        })
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the matrix takes on the device.
    pub fn device_bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// The data plane's device address.
    pub fn data_ptr(&self) -> u64 {
        self.buf.ptr()
    }

    /// The aux plane's device address (0 for the float types, which have none).
    pub fn aux_ptr(&self) -> u64 {
        if self.has_aux {
            self.buf.at(self.aux_offset)
        } else {
            0
        }
    }

    /// The leading kernel arguments for this matrix: `data, aux, rows, cols`, i.e. a kernel's
    /// `(const u8* data, const u8* aux, int rows, int cols, ...)` that rebuilds a `QMatrix`.
    pub fn args(&self) -> [Arg; 4] {
        [
            Arg::Ptr(self.data_ptr()),
            Arg::Ptr(self.aux_ptr()),
            Arg::I32(self.rows as i32),
            Arg::I32(self.cols as i32),
        ]
    }
}

/// Splits `blocks` ggml blocks into the data and aux planes of `l`.
fn repack(l: &Layout, type_size: usize, bytes: &[u8], blocks: usize) -> (Vec<u8>, Vec<u8>) {
    let aux2_len = l.aux2.map_or(0, |(_, n)| n);
    let mut data = vec![0u8; blocks * l.data_bytes];
    let mut aux = vec![0u8; blocks * (l.aux_bytes + aux2_len)];
    let (aux1, aux2) = aux.split_at_mut(blocks * l.aux_bytes);
    for (i, blk) in bytes.chunks_exact(type_size).enumerate() {
        let mut o = i * l.data_bytes;
        for &(src, len) in l.data {
            data[o..o + len].copy_from_slice(&blk[src..src + len]);
            o += len;
        }
        let a = &mut aux1[i * l.aux_bytes..(i + 1) * l.aux_bytes];
        for &(src, dst, len) in l.aux {
            a[dst..dst + len].copy_from_slice(&blk[src..src + len]);
        }
        if let Some((src, len)) = l.aux2 {
            aux2[i * len..(i + 1) * len].copy_from_slice(&blk[src..src + len]);
        }
    }
    (data, aux)
}

/// Whether a type's streamed single-token product has an entry of its own (`gemv_m1_stream`,
/// kernels/gemv.cu's `STREAM_APART`, which must agree), so that its register budget is its own:
/// Q4_0's fits 64 registers there, where its block-per-group walk needs 79 (with three ring
/// slots, tg128 +2.0–2.3 % on the Q4_0 models). The other types keep both walks in `gemv_m1`:
/// apart, the Q4_K and Q6_K models measured 0.2–0.3 % slower and IQ4_NL's block-per-group walk
/// spilled (docs/perf/2026-11-24-stream-ring.md).
fn streams_apart(ty: GgmlType) -> bool {
    ty == GgmlType::Q4_0
}

/// The `-DQTYPE` define of a type's modules.
fn qtype_define(ty: GgmlType) -> Vec<(&'static str, String)> {
    vec![("QTYPE", (ty as u32).to_string())]
}

/// Every kernel module variant this file compiles.
pub fn modules() -> Vec<ModuleSpec> {
    modules_for(SUPPORTED)
}

/// The modules [`MatmulKernels::new`] compiles for `types` (none for a type it refuses).
pub fn modules_for(types: &[GgmlType]) -> Vec<ModuleSpec> {
    let types: Vec<GgmlType> = types.iter().copied().filter(|&t| supported(t)).collect();
    let mut v = Vec::new();
    if types.iter().any(|t| t.is_quantized()) {
        v.push(("gemv.cu", Vec::new()));
    }
    for ty in types {
        v.push(("gemv.cu", qtype_define(ty)));
        v.push(("embed.cu", qtype_define(ty)));
    }
    v
}

/// The kernels of one weight type.
#[derive(Clone)]
struct TypeKernels {
    ty: GgmlType,
    /// `gemv_m{1,2,4,8,16}`.
    gemv: Vec<Kernel>,
    /// `gemv_gated_m{1,2,4,8,16}`.
    gated: Vec<Kernel>,
    /// `gemv_m1_stream` where the type streams apart ([`streams_apart`]): m = 1 on a capped
    /// grid, warps streaming row groups; without it `gemv_m1` does both walks.
    gemv_stream: Option<Kernel>,
    /// `gemv_m2_stream` and `gemv_gated_m2_stream`: m = 2 on a capped grid, warps streaming
    /// row groups as m = 1's do; the plain one where a single token's row groups are 2 rows
    /// (not Q8_0's and the float types': slower there).
    gemv_m2_stream: Option<Kernel>,
    gated_m2_stream: Kernel,
    /// `gemv_m1_split` and `gemv_gated_m1_split`: m = 1 with rows split over warps.
    gemv_split: Kernel,
    gated_split: Kernel,
    /// `gemv_m1_argmax`: m = 1 streamed, choosing the largest output ([`gemv_argmax`]).
    argmax: Kernel,
    /// `gemv_m1_norm`: m = 1 with the residual add and the next norm, where the chip config
    /// folds norms into products; `gemv_m1_norm_split`, the same on clusters, where it lets
    /// several blocks share a group.
    norm: Option<Kernel>,
    norm_split: Option<Kernel>,
    /// The same two quantizing their f32 input themselves (quantized types, where the chip
    /// config's `gemv_norm_quant` allows).
    norm_q: Option<Kernel>,
    norm_split_q: Option<Kernel>,
    embed: Kernel,
    /// The lookup with the first RMSNorm ([`embed_norm`]).
    embed_norm: Kernel,
    /// The batched products on tensor cores, for the types that have them ([`has_mma`]).
    mma: Option<MmaKernels>,
}

/// One type's tensor-core products, indexed by tiles of 8 tokens − 1: `gemv_mma_n{1,2}_r16`,
/// and `gemv_mma_n{1,2}_r32` with `gemv_gated_mma_n{1,2}` where the type has them (not Q6_K:
/// they would spill).
#[derive(Clone)]
struct MmaKernels {
    r16: [Kernel; 2],
    r32_gated: Option<([Kernel; 2], [Kernel; 2])>,
}

impl TypeKernels {
    /// The streaming entry of batch variant `v` (plain or gated), where it has its own: m = 1's
    /// plain one where the type streams apart ([`streams_apart`]; m = 1's other entries stream
    /// themselves on a capped grid), m = 2's gated one, and its plain one where the type has it.
    fn stream(&self, v: usize, gated: bool) -> Option<&Kernel> {
        match (M_VARIANTS[v], gated) {
            (1, false) => self.gemv_stream.as_ref(),
            (2, false) => self.gemv_m2_stream.as_ref(),
            (2, true) => Some(&self.gated_m2_stream),
            _ => None,
        }
    }
}

impl MmaKernels {
    fn new(gpu: &Gpu, ty: GgmlType, defines: &[(&str, String)]) -> Result<MmaKernels, CudaError> {
        let k = |name: &str| gpu.kernel("gemv.cu", name, defines);
        Ok(MmaKernels {
            r16: [k("gemv_mma_n1_r16")?, k("gemv_mma_n2_r16")?],
            r32_gated: (ty != GgmlType::Q6_K)
                .then(|| -> Result<_, CudaError> {
                    Ok((
                        [k("gemv_mma_n1_r32")?, k("gemv_mma_n2_r32")?],
                        [k("gemv_gated_mma_n1")?, k("gemv_gated_mma_n2")?],
                    ))
                })
                .transpose()?,
        })
    }

    /// The plain product for a batch of `m` with at most `rows` (16 or 32) weight rows a
    /// block, and its rows a block.
    fn plain(&self, m: usize, rows: usize) -> (&Kernel, usize) {
        let nt = m.div_ceil(8) - 1;
        match &self.r32_gated {
            Some((r32, _)) if rows > 16 => (&r32[nt], 32),
            _ => (&self.r16[nt], 16),
        }
    }

    /// The gated product for a batch of `m`, where the type has one.
    fn gated(&self, m: usize) -> Option<&Kernel> {
        let nt = m.div_ceil(8) - 1;
        self.r32_gated.as_ref().map(|(_, gated)| &gated[nt])
    }
}

/// Whether products of type `ty` have tensor-core kernels for batches on a device of compute
/// capability `cc` (`kernels/gemv.cu`: the int8 `mma.sync` needs 8.0).
fn has_mma(ty: GgmlType, cc: (i32, i32)) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K) && cc.0 >= 8
}

/// Values per step of a warp in the tensor-core products: 16 bytes of a row's 4-bit quants
/// (four Q4_0 blocks, half a Q4_K or Q6_K superblock). Rows must be a multiple of it.
const MMA_COLS: usize = 128;

/// Warps per block of the tensor-core products (`MMA_WARPS` in `kernels/gemv.cu`).
const MMA_WARPS: usize = 8;

/// Waves of 16-row blocks (at two an SM) up to which batches below the chip config's
/// `gemv_mma_from` may take the tensor-core products: the layers' matrices (14,336 rows: 3.4
/// waves on 132 SMs), not the vocabulary (128,256: 30).
const MMA_SMALL_WAVES: usize = 8;

/// A setting of the tensor-core products' weight rows per block as the kernels have them: 0
/// (by the launch's size, [`MatmulKernels::mma_block_rows`]), else 16 up to 16, else 32.
pub(crate) fn mma_rows_setting(rows: usize) -> usize {
    match rows {
        0 => 0,
        1..=16 => 16,
        _ => 32,
    }
}

/// A "from this batch on" setting of the tensor-core products: 0 (never) or at least 2 (a
/// single token's products have kernels of their own).
pub(crate) fn mma_from_setting(from: usize) -> usize {
    match from {
        0 => 0,
        m => m.max(2),
    }
}

/// The compiled kernels for a set of weight types.
#[derive(Clone)]
pub struct MatmulKernels {
    types: Vec<TypeKernels>,
    /// The activation quantizer; present when any type is quantized.
    quantize: Option<Kernel>,
    /// Warps per block of the products (a power of two).
    warps: u32,
    /// Warps per block of the single-token products over rows of at most one chunk per lane
    /// ([`MatmulKernels::block_warps`]).
    narrow_warps: u32,
    /// Warps a product's grid should have before it splits rows' columns over warps.
    fill_warps: usize,
    /// Products of one input that share a launch in [`gemv_many`].
    parts: usize,
    /// Whether the first weight loads go ahead of the wait for the preceding kernel.
    early: bool,
    /// Whether narrow single-token products release the next kernel before that wait
    /// ([`MatmulKernels::start`]).
    release_narrow: bool,
    /// The largest grid of the streamed products of one and two tokens.
    cap: GridCap,
    /// The smallest batch that takes the tensor-core products (0: none), their weight rows per
    /// block (16 or 32; 0: by the launch, [`MatmulKernels::mma_block_rows`]) and the blocks that
    /// fill the GPU at two an SM.
    mma_from: usize,
    mma_rows: usize,
    mma_fill: usize,
    /// The smallest batch below `mma_from` that takes the tensor-core products in launches
    /// of few rows ([`MatmulKernels::mma_for`]; 0: none).
    mma_small_from: usize,
}

/// How many blocks a product of one or two tokens with unsplit rows launches at most; its warps
/// then walk the row groups of the blocks beyond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GridCap {
    /// This many times the blocks resident on the GPU at once (0: one block per row group).
    Waves(usize),
    /// At most this many blocks.
    Blocks(usize),
}

impl MatmulKernels {
    /// Compiles (or loads from the cache) what `types` need; repeated types count once.
    pub fn new(gpu: &Arc<Gpu>, types: &[GgmlType]) -> Result<MatmulKernels, CudaError> {
        let mut out: Vec<TypeKernels> = Vec::new();
        for &ty in types {
            if out.iter().any(|k| k.ty == ty) {
                continue;
            }
            if !supported(ty) {
                return Err(CudaError::Unsupported(format!(
                    "no CUDA kernels for {ty} matrices"
                )));
            }
            let defines = qtype_define(ty);
            let mut gemv = Vec::with_capacity(M_VARIANTS.len());
            let mut gated = Vec::with_capacity(M_VARIANTS.len());
            for m in M_VARIANTS {
                gemv.push(gpu.kernel("gemv.cu", &format!("gemv_m{m}"), &defines)?);
                gated.push(gpu.kernel("gemv.cu", &format!("gemv_gated_m{m}"), &defines)?);
            }
            let embed = gpu.kernel("embed.cu", "embed", &defines)?;
            let embed_norm = gpu.kernel("embed.cu", "embed_norm", &defines)?;
            let chip = &gpu.chip;
            let quant_in = ty.is_quantized() && chip.gemv_norm_quant > 0;
            // The quantizing ones keep the input's levels and sums in shared memory, and
            // launches on few blocks ask for a whole SM's (`gemv_residual_norm`).
            let norm_kernel = |name: &str, on: bool| -> Result<Option<Kernel>, CudaError> {
                let k = on
                    .then(|| gpu.kernel("gemv.cu", name, &defines))
                    .transpose()?;
                if let Some(k) = &k {
                    k.set_max_dynamic_smem(max_norm_quant_smem(gpu))?;
                }
                Ok(k)
            };
            out.push(TypeKernels {
                ty,
                gemv,
                gated,
                gemv_stream: streams_apart(ty)
                    .then(|| gpu.kernel("gemv.cu", "gemv_m1_stream", &defines))
                    .transpose()?,
                gemv_m2_stream: (rows_per_warp(ty, 1) == 2)
                    .then(|| gpu.kernel("gemv.cu", "gemv_m2_stream", &defines))
                    .transpose()?,
                gated_m2_stream: gpu.kernel("gemv.cu", "gemv_gated_m2_stream", &defines)?,
                gemv_split: gpu.kernel("gemv.cu", "gemv_m1_split", &defines)?,
                gated_split: gpu.kernel("gemv.cu", "gemv_gated_m1_split", &defines)?,
                argmax: gpu.kernel("gemv.cu", "gemv_m1_argmax", &defines)?,
                norm: norm_kernel("gemv_m1_norm", chip.gemv_norm > 0)?,
                norm_split: norm_kernel("gemv_m1_norm_split", chip.gemv_norm > 1)?,
                norm_q: norm_kernel("gemv_m1_norm_q", chip.gemv_norm > 0 && quant_in)?,
                norm_split_q: norm_kernel("gemv_m1_norm_split_q", chip.gemv_norm > 1 && quant_in)?,
                embed,
                embed_norm,
                mma: has_mma(ty, chip.compute_capability)
                    .then(|| MmaKernels::new(gpu, ty, &defines))
                    .transpose()?,
            });
        }
        let quantize = if out.iter().any(|k| k.ty.is_quantized()) {
            Some(gpu.kernel("gemv.cu", "quantize_act", &[])?)
        } else {
            None
        };
        let kernels = MatmulKernels {
            types: out,
            quantize,
            warps: 0,
            narrow_warps: 0,
            fill_warps: 0,
            parts: gpu.chip.gemv_parts,
            early: gpu.chip.gemv_early_loads,
            release_narrow: gpu.chip.gemv_narrow_release,
            cap: GridCap::Waves(gpu.chip.gemv_waves),
            mma_from: gpu.chip.gemv_mma_from,
            mma_rows: gpu.chip.gemv_mma_rows,
            mma_fill: 2 * gpu.chip.sm_count,
            mma_small_from: gpu.chip.gemv_mma_small_from,
        };
        let fill = gpu.chip.sm_count * gpu.chip.gemv_fill_warps;
        let mut kernels = kernels.with_split(gpu.chip.gemv_warps, fill);
        if gpu.chip.gemv_narrow_warps > 0 {
            kernels.narrow_warps = round_block_warps(gpu.chip.gemv_narrow_warps);
        }
        Ok(kernels)
    }

    /// The same kernels launched in blocks of `warps` (rounded up to a power of two, at most 8)
    /// that split rows' columns while a grid has fewer than `fill_warps` warps in all (0: never
    /// split; `usize::MAX`: split as far as the block and the row length allow).
    pub fn with_split(mut self, warps: usize, fill_warps: usize) -> MatmulKernels {
        self.warps = round_block_warps(warps);
        self.narrow_warps = self.warps;
        self.fill_warps = fill_warps;
        self
    }

    /// Warps per block of a product of `cols`-wide rows of type `ty` in batch variant `m`: the
    /// chip config's `gemv_narrow_warps` for single-token products whose rows are at most one
    /// chunk per lane, else `gemv_warps`.
    fn block_warps(&self, ty: GgmlType, m: usize, cols: usize) -> u32 {
        if narrow(ty, m, cols) {
            self.narrow_warps
        } else {
            self.warps
        }
    }

    /// `early` of a plain or gated product's launch ([`start_mode`]): narrow single-token
    /// products release the next kernel before their wait. Their work after it (one chunk a
    /// lane) ends too soon to cover the next kernel's start, which then overlaps the wait
    /// instead: tg128 +4.9 % on qwen3-0.6b, +5.0 % on Gemma 3 270M
    /// (docs/perf/2026-11-24-early-release.md).
    fn start(&self, ty: GgmlType, m: usize, cols: usize) -> i32 {
        start_mode(self.early, self.release_narrow && narrow(ty, m, cols))
    }

    /// The same kernels with batches of at least `from` tokens (0: none; 1 reads as 2) on the
    /// tensor-core products, `rows` (16 or 32; 0: by the launch) weight rows to a block.
    pub fn with_mma(mut self, from: usize, rows: usize) -> MatmulKernels {
        self.mma_from = mma_from_setting(from);
        self.mma_rows = mma_rows_setting(rows);
        self
    }

    /// Weight rows per block of a tensor-core launch over `rows` rows: 32 where that still
    /// gives every SM two blocks, else 16 (unless fixed). Two fit an SM at 128 registers; with
    /// fewer blocks SMs idle, while 32 rows share each activation load between twice the rows:
    /// 16 measured faster up to 4,096 rows, 32 from 14,336.
    fn mma_block_rows(&self, rows: usize) -> usize {
        match self.mma_rows {
            0 if rows.div_ceil(32) >= self.mma_fill => 32,
            0 => 16,
            r => r,
        }
    }

    /// The tensor-core products of a batch of `m` over `cols`-wide rows of `tk`'s type, where
    /// they apply: from `mma_from` tokens, and from `mma_small_from` in launches that suit
    /// them (`rows`: a plain launch's rows, or a gated product's per matrix). Measured at 3 and
    /// 4 tokens (docs/perf/2026-11-25-mma-small-batches.md): plain products 0.65–0.99x the
    /// `dp4a` time on the layers' matrices but 1.12–1.42x on the vocabulary, so at most
    /// [`MMA_SMALL_WAVES`] waves of 16-row blocks, and Q4_K's only from one token more (0.98–1.16x
    /// at 3); gated products 0.57–0.97x where their blocks (16 rows of each matrix) give at
    /// least half the SMs one, up to 1.39x at 1,024 rows.
    fn mma_for<'a>(
        &self,
        tk: &'a TypeKernels,
        m: usize,
        (rows, gated): (usize, bool),
        cols: usize,
    ) -> Option<&'a MmaKernels> {
        let small = self.mma_small_from > 0
            && m >= self.mma_small_from
            && if gated {
                // `mma_fill` is two blocks an SM.
                4 * rows.div_ceil(16) >= self.mma_fill
            } else {
                (tk.ty != GgmlType::Q4_K || m > self.mma_small_from)
                    && rows.div_ceil(16) <= MMA_SMALL_WAVES * self.mma_fill
            };
        tk.mma.as_ref().filter(|_| {
            self.mma_from > 0 && (m >= self.mma_from || small) && cols.is_multiple_of(MMA_COLS)
        })
    }

    /// Whether a product of a batch of `m` over a `rows` × `cols` matrix of type `ty` (with
    /// `gated`, a gated product over two) runs on tensor cores. Plain and gated products of
    /// the same matrices may differ (their rules: `mma_for`).
    pub fn on_tensor_cores(
        &self,
        ty: GgmlType,
        m: usize,
        (rows, cols): (usize, usize),
        gated: bool,
    ) -> bool {
        let mma = self
            .of(ty)
            .ok()
            .and_then(|tk| self.mma_for(tk, m, (rows, gated), cols));
        match mma {
            Some(mk) if gated => mk.gated(m).is_some(),
            Some(_) => true,
            None => false,
        }
    }

    /// The same kernels with the streamed products' grid capped at `cap`.
    pub fn with_grid_cap(mut self, cap: GridCap) -> MatmulKernels {
        self.cap = cap;
        self
    }

    /// The kernel and grid of a product of `blocks` blocks of `warps` warps in batch variant `v`
    /// with `ks` warps per row group (`entries`: the split entry, the variants' entries and the
    /// variant's streaming entry where it has its own): the split entry; the variant's entry
    /// with a block per row group where the grid cap allows them all; else the streaming entry
    /// on the capped grid (m = 1 without one: its own entry streams).
    fn launch_shape<'a>(
        &self,
        gpu: &Gpu,
        (split, variants, stream): (&'a Kernel, &'a [Kernel], Option<&'a Kernel>),
        v: usize,
        ks: usize,
        blocks: usize,
        warps: u32,
    ) -> Result<(&'a Kernel, usize), CudaError> {
        if ks > 1 {
            return Ok((split, blocks));
        }
        let k = &variants[v];
        let cap = |kernel: &Kernel| -> Result<usize, CudaError> {
            Ok(match self.cap {
                GridCap::Waves(w) => {
                    w * gpu.chip.sm_count * gpu.blocks_per_sm(kernel, 32 * warps, 0)?
                }
                GridCap::Blocks(b) => b,
            }
            .max(1))
        };
        if self.cap == GridCap::Waves(0) || (v != 0 && stream.is_none()) {
            return Ok((k, blocks));
        }
        let cap_k = cap(k)?;
        if blocks <= cap_k {
            return Ok((k, blocks));
        }
        match stream {
            Some(s) => Ok((s, blocks.min(cap(s)?))),
            None => Ok((k, cap_k)),
        }
    }

    /// Whether [`gemv_residual_norm`] is available (the chip config's `gemv_norm`).
    pub fn folds_norms(&self) -> bool {
        self.types.iter().all(|t| t.norm.is_some())
    }

    /// Whether [`gemv_residual_norm`] of every quantized type here can quantize its input
    /// itself (the chip config's `gemv_norm_quant`).
    pub fn norms_quantize_inputs(&self) -> bool {
        self.types
            .iter()
            .all(|t| !t.ty.is_quantized() || t.norm_q.is_some())
    }

    /// Whether products with these kernels read quantized activations (some weight type is
    /// quantized), which [`ActScratch::prepare`] then writes.
    pub fn quantizes(&self) -> bool {
        self.quantize.is_some()
    }

    fn of(&self, ty: GgmlType) -> Result<&TypeKernels, CudaError> {
        self.types.iter().find(|k| k.ty == ty).ok_or_else(|| {
            CudaError::Unsupported(format!("the matmul kernels were not built for {ty}"))
        })
    }
}

/// The variant index for a batch of `m` (1 ≤ m ≤ 16).
fn variant(m: usize) -> usize {
    M_VARIANTS
        .iter()
        .position(|&v| v >= m)
        .unwrap_or(M_VARIANTS.len() - 1)
}

/// Output rows per warp of the plain product kernel for batch variant `m` (`NR` in
/// `kernels/gemv.cu`, `M1_ROWS` there for m = 1).
fn rows_per_warp(ty: GgmlType, m: usize) -> usize {
    use GgmlType as T;
    match m {
        1 if matches!(ty, T::F32 | T::F16 | T::BF16 | T::Q8_0) => 1,
        4 | 8 => 4,
        _ => 2,
    }
}

/// `warps` as a block size of the product kernels: a power of two up to 8.
fn round_block_warps(warps: usize) -> u32 {
    warps.clamp(1, 8).next_power_of_two() as u32
}

/// Values per chunk, the unit a lane loads (`CV` in `kernels/gemv.cu`).
fn chunk_values(ty: GgmlType) -> usize {
    use GgmlType as T;
    match ty {
        T::F32 => 4,
        T::F16 | T::BF16 => 8,
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K => 64,
        _ => 32,
    }
}

/// How a product's blocks order their first weight loads, the wait for the preceding kernel
/// and the release of the next one (`early` of `start_product` in `kernels/gemv.cu`): the loads
/// before the wait where `loads_first` (the chip config's `gemv_early_loads`), and the release
/// before both where `release_first`.
fn start_mode(loads_first: bool, release_first: bool) -> i32 {
    match (loads_first, release_first) {
        (false, _) => 0,
        (true, false) => 1,
        (true, true) => 2,
    }
}

/// Whether a product of `cols`-wide rows of type `ty` in batch variant `m` is a single-token
/// product whose rows are at most one chunk per lane.
fn narrow(ty: GgmlType, m: usize, cols: usize) -> bool {
    m == 1 && cols <= 32 * chunk_values(ty)
}

/// Warps per row group (`ksplit` in `kernels/gemv.cu`): for batch variant 1, the fewest,
/// doubling up to the block's warps, that give a grid of `groups` row groups `fill` warps,
/// while each lane keeps at least one chunk of a `cols`-wide row; 1 for the other variants,
/// whose kernels keep the 32-chunk stride a compile-time constant.
fn ksplit(ty: GgmlType, m: usize, groups: usize, cols: usize, warps: usize, fill: usize) -> usize {
    let chunks = cols / chunk_values(ty);
    let mut ks = 1;
    while m == 1 && 2 * ks <= warps && groups * ks < fill && chunks >= 64 * ks {
        ks *= 2;
    }
    ks
}

/// One input of the products, prepared once: int8 levels per 32 values with their scales and
/// level sums for quantized weights, and the f32 rows themselves for float weights.
///
/// [`ActScratch::prepare`] launches the quantizer (when the kernels have a quantized type) and
/// remembers the input; every [`gemv`] and [`gemv_gated`] until the next `prepare` reads it.
pub struct ActScratch {
    /// Two sets of levels and sums: `cur` holds the prepared input, and a product that writes
    /// the next input ([`gemv_residual_norm`]) writes the other while it reads this one.
    q: [DeviceBuffer; 2],
    s: [DeviceBuffer; 2],
    cur: usize,
    /// The groups' sums of squares of an input written by [`gemv_residual_norm`].
    ssq: DeviceBuffer,
    max_m: usize,
    max_cols: usize,
    /// The prepared input: `m` rows of `cols` f32 at `x`, `x_stride` floats apart.
    x: u64,
    x_stride: usize,
    m: usize,
    cols: usize,
    quantized: bool,
    /// The prepared input still needs dividing by its RMS: the norm's epsilon
    /// ([`gemv_residual_norm`]).
    rms_eps: Option<f32>,
    /// An input another kernel quantized into the scratch ([`ActScratch::written_by`]): the next
    /// `prepare` of exactly that input launches nothing.
    adopted: Option<Adopted>,
}

/// An input written into the scratch by the kernel that computed it.
#[derive(Clone, Copy, PartialEq)]
struct Adopted {
    x: u64,
    x_stride: usize,
    m: usize,
    cols: usize,
    rms_eps: Option<f32>,
}

impl ActScratch {
    /// Scratch for inputs of up to `max_m` rows of up to `max_cols` values.
    pub fn new(gpu: &Gpu, max_m: usize, max_cols: usize) -> Result<ActScratch, CudaError> {
        if max_m == 0 || max_m > MAX_M || max_cols == 0 || !max_cols.is_multiple_of(GROUP) {
            return Err(CudaError::Unsupported(format!(
                "activation scratch of {max_m}x{max_cols}: needs 1..={MAX_M} rows and a \
                 positive multiple of {GROUP} columns"
            )));
        }
        let q = [gpu.alloc(max_m * max_cols)?, gpu.alloc(max_m * max_cols)?];
        let groups = max_m * (max_cols / GROUP);
        let s = [gpu.alloc(groups * 16)?, gpu.alloc(groups * 16)?];
        Ok(ActScratch {
            q,
            s,
            cur: 0,
            ssq: gpu.alloc(groups * 4)?,
            max_m,
            max_cols,
            x: 0,
            x_stride: 0,
            m: 0,
            cols: 0,
            quantized: false,
            rms_eps: None,
            adopted: None,
        })
    }

    /// Forgets an input another kernel wrote into the scratch, so the next `prepare`
    /// quantizes: for the start of a pass, whatever an earlier one left undone.
    pub fn forget_written(&mut self) {
        self.adopted = None;
    }

    /// Whether `m` rows of `cols` values fit the scratch and its 32-value groups.
    fn check_shape(&self, m: usize, cols: usize) -> Result<(), CudaError> {
        if m == 0 || m > self.max_m || cols == 0 || cols > self.max_cols {
            return Err(CudaError::Bounds(format!(
                "activations of {m}x{cols} in scratch of {}x{}",
                self.max_m, self.max_cols
            )));
        }
        if !cols.is_multiple_of(GROUP) {
            return Err(CudaError::Unsupported(format!(
                "{cols} activation columns: must be a multiple of {GROUP}"
            )));
        }
        Ok(())
    }

    /// Enqueues `launch`, a kernel that writes the dense `m × cols` input `x` of the next
    /// products. With `fuse` it gets where to write the int8 form of `x` as well (levels and
    /// sums, the format of `kernels/actq.cuh`), and the next `prepare` of exactly that input
    /// launches nothing; without, it gets `None`.
    pub fn written_by(
        &mut self,
        fuse: bool,
        x: u64,
        m: usize,
        cols: usize,
        launch: impl FnOnce(Option<(u64, u64)>) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        if !fuse {
            return launch(None);
        }
        self.check_shape(m, cols)?;
        launch(Some((self.q[self.cur].ptr(), self.s[self.cur].ptr())))?;
        self.adopted = Some(Adopted {
            x,
            x_stride: cols,
            m,
            cols,
            rms_eps: None,
        });
        Ok(())
    }

    /// Prepares `m` rows of `cols` f32 values at device address `x`, `x_stride` floats apart,
    /// for products with weights of the kernels' types. `x` must be 16-byte aligned and
    /// `x_stride` a multiple of 4; the input must stay unchanged until its last product.
    pub fn prepare(
        &mut self,
        gpu: &Gpu,
        k: &MatmulKernels,
        x: u64,
        x_stride: usize,
        m: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        self.prepare_as(gpu, k.quantize.as_ref(), x, x_stride, m, cols)
    }

    /// Prepares the input as [`ActScratch::prepare`] does, but leaves its quantization to the
    /// product: only float weights and [`gemv_residual_norm`] where
    /// [`residual_norm_quantizes`] accept it.
    pub fn prepare_unquantized(
        &mut self,
        gpu: &Gpu,
        x: u64,
        x_stride: usize,
        m: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        self.prepare_as(gpu, None, x, x_stride, m, cols)
    }

    /// `prepare`, quantizing with `quantize` unless the input was written into the scratch.
    fn prepare_as(
        &mut self,
        gpu: &Gpu,
        quantize: Option<&Kernel>,
        x: u64,
        x_stride: usize,
        m: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        self.check_shape(m, cols)?;
        if x == 0 || !x.is_multiple_of(16) || x_stride < cols || !x_stride.is_multiple_of(4) {
            return Err(CudaError::Bounds(format!(
                "activations at {x:#x} with stride {x_stride}: need a 16-byte aligned address \
                 and a stride of at least {cols}, a multiple of 4"
            )));
        }
        if x_stride > i32::MAX as usize {
            return Err(CudaError::Bounds(format!("activation stride {x_stride}")));
        }
        self.quantized = false;
        self.rms_eps = None;
        let adopted = self
            .adopted
            .take()
            .filter(|a| (a.x, a.x_stride, a.m, a.cols) == (x, x_stride, m, cols));
        if let Some(a) = adopted {
            self.rms_eps = a.rms_eps;
        }
        if let (Some(quantize), None) = (quantize, adopted) {
            let groups = (cols / GROUP) as u32;
            gpu.launch(
                quantize,
                (groups.div_ceil(8), m as u32, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(x),
                    Arg::I32(x_stride as i32),
                    Arg::I32(m as i32),
                    Arg::I32(cols as i32),
                    Arg::Ptr(self.q[self.cur].ptr()),
                    Arg::Ptr(self.s[self.cur].ptr()),
                ],
            )?;
        }
        self.quantized = quantize.is_some() || adopted.is_some();
        self.x = x;
        self.x_stride = x_stride;
        self.m = m;
        self.cols = cols;
        Ok(())
    }

    /// The rows prepared last.
    pub fn m(&self) -> usize {
        self.m
    }

    /// The row length prepared last.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The prepared one-token input of a product that quantizes it itself (f32 only).
    fn args_unquantized(&self, w: &DeviceMatrix) -> Result<ActArgs, CudaError> {
        if self.m != 1 || w.cols != self.cols {
            return Err(CudaError::Bounds(format!(
                "a {}x{} matrix times {} prepared rows of {} columns",
                w.rows, w.cols, self.m, self.cols
            )));
        }
        Ok(ActArgs {
            q: 0,
            s: 0,
            x: self.x,
            x_stride: self.x_stride as i32,
            ssq: 0,
            eps: 0.0,
        })
    }

    /// The activation arguments of the product kernels: `aq, as, xf, x_stride`.
    fn args(&self, w: &DeviceMatrix, m: usize) -> Result<ActArgs, CudaError> {
        if self.m == 0 {
            return Err(CudaError::Bounds(
                "the activations were not prepared".into(),
            ));
        }
        if w.cols != self.cols {
            return Err(CudaError::Bounds(format!(
                "a {}x{} matrix times activations of {} columns",
                w.rows, w.cols, self.cols
            )));
        }
        if m == 0 || m > self.m {
            return Err(CudaError::Bounds(format!(
                "a product of {m} rows with {} prepared",
                self.m
            )));
        }
        if w.ty.is_quantized() && !self.quantized {
            return Err(CudaError::Unsupported(format!(
                "the activations were prepared without quantization, which {} weights need",
                w.ty
            )));
        }
        Ok(ActArgs {
            q: self.q[self.cur].ptr(),
            s: self.s[self.cur].ptr(),
            x: self.x,
            x_stride: self.x_stride as i32,
            ssq: if self.rms_eps.is_some() {
                self.ssq.ptr()
            } else {
                0
            },
            eps: self.rms_eps.unwrap_or(0.0),
        })
    }
}

/// The prepared input as the product kernels take it.
struct ActArgs {
    q: u64,
    s: u64,
    x: u64,
    x_stride: i32,
    /// `Acts::ssq` and `Acts::eps` in `kernels/gemv.cu` (0 for an input divided already).
    ssq: u64,
    eps: f32,
}

fn check_output(
    what: &str,
    ptr: u64,
    stride: usize,
    rows: usize,
    m: usize,
) -> Result<(), CudaError> {
    if ptr == 0 || (m > 1 && stride < rows) || stride > i32::MAX as usize {
        return Err(CudaError::Bounds(format!(
            "{what} at {ptr:#x} with stride {stride} for {m} rows of {rows}"
        )));
    }
    Ok(())
}

/// One output of [`gemv_many`]: `y[t*y_stride + r] = Σ_c W[r][c]·x[t][c] (+ bias[r])`, with
/// `bias` a device array of `w.rows()` f32.
#[derive(Clone, Copy)]
pub struct Product<'a> {
    pub w: &'a DeviceMatrix,
    pub y: u64,
    pub y_stride: usize,
    pub bias: Option<u64>,
}

/// Most products one multi-matrix launch takes (`GemvParams` in `kernels/gemv.cu`,
/// `GemmParams` in `kernels/gemm.cu`).
pub const MAX_PARTS: usize = 3;

/// The weight type every product of one multi-matrix launch shares (`None` for no products);
/// refuses more than [`MAX_PARTS`] products or mixed types.
pub(crate) fn launch_type(parts: &[Product]) -> Result<Option<GgmlType>, CudaError> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    if parts.len() > MAX_PARTS {
        return Err(CudaError::Unsupported(format!(
            "{} products in one launch: at most {MAX_PARTS}",
            parts.len()
        )));
    }
    let ty = first.w.ty;
    if let Some(p) = parts.iter().find(|p| p.w.ty != ty) {
        return Err(CudaError::Unsupported(format!(
            "{} and {ty} products in one launch",
            p.w.ty
        )));
    }
    Ok(Some(ty))
}

/// Calls `launch` on each run of `parts` with one weight type, at most `max` (≤
/// [`MAX_PARTS`]) products long, in order.
pub(crate) fn for_each_launch(
    parts: &[Product],
    max: usize,
    mut launch: impl FnMut(&[Product]) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    let mut rest = parts;
    while let Some(first) = rest.first() {
        let n = rest
            .iter()
            .take(max.clamp(1, MAX_PARTS))
            .take_while(|p| p.w.ty == first.w.ty)
            .count();
        launch(&rest[..n])?;
        rest = &rest[n..];
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemvPart {
    data: u64,
    aux: u64,
    y: u64,
    bias: u64,
    rows: i32,
    y_stride: i32,
    first_block: i32,
    pad: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemvParams {
    part: [GemvPart; MAX_PARTS],
    aq: u64,
    as_: u64,
    xf: u64,
    x_stride: i32,
    cols: i32,
    m: i32,
    mode: i32,
    ksplit: i32,
    parts: i32,
    early: i32,
    /// Blocks of row groups in all; the grid may have fewer (the m = 1 unsplit kernel).
    blocks: i32,
    ssq: u64,
    eps: f32,
    pad: i32,
}

impl GemvPart {
    /// The part of product `p`, its blocks counted from the launch's first.
    fn of(p: &Product) -> GemvPart {
        GemvPart {
            data: p.w.data_ptr(),
            aux: p.w.aux_ptr(),
            y: p.y,
            bias: p.bias.unwrap_or(0),
            rows: p.w.rows as i32,
            y_stride: p.y_stride as i32,
            first_block: 0,
            pad: 0,
        }
    }
}

impl GemvParams {
    /// The prepared input's fields.
    fn set_input(&mut self, a: &ActArgs) {
        (self.aq, self.as_, self.xf, self.x_stride) = (a.q, a.s, a.x, a.x_stride);
        (self.ssq, self.eps) = (a.ssq, a.eps);
    }
}

/// Launches the plain product kernel over `parts`: mode 0 stores (plus bias), 1 and 2
/// multiply into silu(y) and gelu(y).
fn launch_gemv(
    gpu: &Gpu,
    k: &MatmulKernels,
    parts: &[Product],
    acts: &ActScratch,
    m: usize,
    mode: i32,
) -> Result<(), CudaError> {
    let Some(ty) = launch_type(parts)? else {
        return Ok(());
    };
    let tk = k.of(ty)?;
    let v = variant(m);
    let nr = rows_per_warp(ty, M_VARIANTS[v]);
    let cols = parts[0].w.cols;
    let warps = k.block_warps(ty, M_VARIANTS[v], cols) as usize;
    let mut params = GemvParams::zeroed();
    let mut groups = 0;
    for (i, p) in parts.iter().enumerate() {
        check_output("gemv output", p.y, p.y_stride, p.w.rows, m)?;
        if p.bias == Some(0) {
            return Err(CudaError::Bounds("a null bias pointer".into()));
        }
        params.set_input(&acts.args(p.w, m)?);
        params.part[i] = GemvPart::of(p);
        groups += p.w.rows.div_ceil(nr);
    }
    let all_rows = parts.iter().map(|p| p.w.rows).sum();
    let mma = k
        .mma_for(tk, m, (all_rows, false), cols)
        .map(|mk| mk.plain(m, k.mma_block_rows(all_rows)));
    let ks = match mma {
        Some(_) => 1,
        None => ksplit(ty, M_VARIANTS[v], groups, cols, warps, k.fill_warps),
    };
    let rows_per_block = match mma {
        Some((_, rows)) => rows,
        None => warps / ks * nr,
    };
    let mut blocks = 0;
    for (part, p) in params.part.iter_mut().zip(parts) {
        part.first_block = blocks as i32;
        blocks += p.w.rows.div_ceil(rows_per_block);
    }
    params.cols = cols as i32;
    params.m = m as i32;
    params.mode = mode;
    params.ksplit = ks as i32;
    params.parts = parts.len() as i32;
    params.early = k.start(ty, M_VARIANTS[v], cols);
    params.blocks = blocks as i32;
    if let Some((kernel, _)) = mma {
        return gpu.launch_with(
            kernel,
            (blocks as u32, 1, 1),
            (32 * MMA_WARPS as u32, 1, 1),
            0,
            &params,
        );
    }
    let kernels = (&tk.gemv_split, &tk.gemv[..], tk.stream(v, false));
    launch_shaped(gpu, k, kernels, (v, ks, blocks, warps), &params)
}

/// Launches `params` on the kernel and grid [`MatmulKernels::launch_shape`] picks among
/// `kernels` for variant `v`, `ks` warps a row group and `blocks` blocks of `warps` warps.
fn launch_shaped<T: Pod>(
    gpu: &Gpu,
    k: &MatmulKernels,
    kernels: (&Kernel, &[Kernel], Option<&Kernel>),
    (v, ks, blocks, warps): (usize, usize, usize, usize),
    params: &T,
) -> Result<(), CudaError> {
    let (kernel, grid) = k.launch_shape(gpu, kernels, v, ks, blocks, warps as u32)?;
    gpu.launch_with(
        kernel,
        (grid as u32, 1, 1),
        (32 * warps as u32, 1, 1),
        0,
        params,
    )
}

/// `y[t*y_stride + r] = Σ_c W[r][c]·x[t][c] (+ bias[r])` for the first `m` (≤ 16) prepared
/// input rows `x[t]` of `acts`; `bias` is a device array of `w.rows()` f32.
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    gpu: &Gpu,
    k: &MatmulKernels,
    w: &DeviceMatrix,
    acts: &ActScratch,
    m: usize,
    y: u64,
    y_stride: usize,
    bias: Option<u64>,
) -> Result<(), CudaError> {
    let part = Product {
        w,
        y,
        y_stride,
        bias,
    };
    launch_gemv(gpu, k, &[part], acts, m, 0)
}

/// The products of matrices with the first `m` prepared input rows of `acts`: each run of one
/// weight type, up to [`MAX_PARTS`] (fewer if the chip config says so), in one launch.
pub fn gemv_many(
    gpu: &Gpu,
    k: &MatmulKernels,
    parts: &[Product],
    acts: &ActScratch,
    m: usize,
) -> Result<(), CudaError> {
    for_each_launch(parts, k.parts, |run| launch_gemv(gpu, k, run, acts, m, 0))
}

/// Where [`gemv_argmax`] records its token: `out` (one `u32`), the decode chain's state, and
/// [`ARGMAX_SCRATCH_BYTES`] of device scratch, zeroed before the first launch (every launch
/// leaves it zeroed).
#[derive(Clone, Copy, Debug)]
pub struct ArgmaxTarget {
    pub out: u64,
    pub chain: Chain,
    pub scratch: u64,
}

/// Bytes of [`ArgmaxTarget::scratch`]: the best key so far (`u64`), then the blocks' ticket.
pub const ARGMAX_SCRATCH_BYTES: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ArgmaxParams {
    gemv: GemvParams,
    key: u64,
    ticket: u64,
    out: u64,
    chain: [u64; 3],
}

/// The index of the largest of `w`·x over `w`'s rows, for the first prepared input row of
/// `acts`, into `target` (and its chain), without writing the products: one launch where a
/// product and an argmax over its output took two. The choice is `SampleKernels::argmax`'s
/// over the products: ties go to the lowest row, NaN is skipped, all NaN gives 0. The warps
/// stream their row groups on a grid capped at what the GPU holds, as a single token's large
/// products do.
pub fn gemv_argmax(
    gpu: &Gpu,
    k: &MatmulKernels,
    w: &DeviceMatrix,
    acts: &ActScratch,
    target: &ArgmaxTarget,
) -> Result<(), CudaError> {
    let c = &target.chain;
    if target.out == 0 || target.scratch == 0 || [c.positions, c.out, c.count].contains(&0) {
        return Err(CudaError::Bounds(format!(
            "an output product's argmax into {target:?}: needs non-null pointers"
        )));
    }
    let tk = k.of(w.ty)?;
    let nr = rows_per_warp(w.ty, 1);
    let warps = k.block_warps(w.ty, 1, w.cols) as usize;
    let blocks = w.rows.div_ceil(warps * nr);
    let mut params = ArgmaxParams::zeroed();
    let g = &mut params.gemv;
    g.set_input(&acts.args(w, 1)?);
    g.part[0] = GemvPart::of(&Product {
        w,
        y: 0,
        y_stride: w.rows,
        bias: None,
    });
    (g.cols, g.m, g.ksplit, g.parts) = (w.cols as i32, 1, 1, 1);
    g.early = k.start(w.ty, 1, w.cols);
    g.blocks = blocks as i32;
    (params.key, params.ticket) = (target.scratch, target.scratch + 8);
    params.out = target.out;
    params.chain = [c.positions, c.out, c.count];
    let one = std::slice::from_ref(&tk.argmax);
    let kernels = (&tk.argmax, one, Some(&tk.argmax));
    launch_shaped(gpu, k, kernels, (0, 1, blocks, warps), &params)
}

/// Where [`gemv_residual_norm`] adds its product, and the norm that follows.
#[derive(Clone, Copy, Debug)]
pub struct ResidualNorm {
    /// The residual stream: one row of the product's `rows` f32, updated in place.
    pub residual: u64,
    /// The next RMSNorm's `rows` f32 weights and its epsilon.
    pub weight: u64,
    pub eps: f32,
    /// Where `residual · weight` goes as f32 (16-byte aligned): the next products' input,
    /// which the following [`ActScratch::prepare`] of this address takes as written.
    pub normed: u64,
}

/// Most blocks that share a row group of [`gemv_residual_norm`] (`part` in
/// `kernels/gemv.cu`).
const MAX_NORM_SPLIT: usize = 4;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormParams {
    gemv: GemvParams,
    residual: u64,
    weight: u64,
    xf: u64,
    q: u64,
    qs: u64,
    ssq: u64,
}

/// Dynamic shared memory of [`gemv_residual_norm`] quantizing its input: what a block may
/// opt into, the kernel's static 512 bytes aside.
fn max_norm_quant_smem(gpu: &Gpu) -> usize {
    gpu.chip.smem_per_block.saturating_sub(512)
}

/// Shared memory for the levels and sums of `cols` input values.
fn norm_quant_smem(cols: usize) -> usize {
    cols + cols / 2
}

/// Blocks that share a 32-row group of [`gemv_residual_norm`] of `w` (`ksplit` of
/// `gemv_m1_norm_split`), given whether the cluster kernel exists. A block per group, warps of
/// M1_ROWS rows; with too few groups to fill the GPU, a cluster of blocks per group splits the
/// rows' columns (a chunk per lane at least), if the matrix is large enough to repay the
/// cluster (the chip config's `gemv_norm_split_bytes`): measured, qwen3-0.6b's products of 1.2
/// and 1.8 MB lost 2 % split, llama3.2-1b's of 2.4 and 9.4 MB gained 1.3 % and 5 %
/// (docs/perf/2026-11-22-residual-norm-products.md).
fn norm_split(gpu: &Gpu, k: &MatmulKernels, w: &DeviceMatrix, clusters: bool) -> usize {
    let nr = rows_per_warp(w.ty, 1);
    let chunks = w.cols / chunk_values(w.ty);
    let most = gpu.chip.gemv_norm.min(MAX_NORM_SPLIT);
    let mut ks = 1;
    while clusters
        && w.device_bytes() >= gpu.chip.gemv_norm_split_bytes
        && 2 * ks <= most
        && w.rows / nr * ks < k.fill_warps
        && chunks >= 32 * 2 * ks
    {
        ks *= 2;
    }
    ks
}

/// Whether [`gemv_residual_norm`] of `w` should take its input unquantized
/// ([`ActScratch::prepare_unquantized`]) and quantize it in its blocks, saving the quantize
/// launch: where the kernels exist and each block reads at most the chip config's
/// `gemv_norm_quant` input values.
pub fn residual_norm_quantizes(gpu: &Gpu, k: &MatmulKernels, w: &DeviceMatrix) -> bool {
    let Ok(tk) = k.of(w.ty) else {
        return false;
    };
    if tk.norm_q.is_none() || norm_quant_smem(w.cols) > max_norm_quant_smem(gpu) {
        return false;
    }
    w.cols / norm_split(gpu, k, w, tk.norm_split_q.is_some()) <= gpu.chip.gemv_norm_quant
}

/// The single-token product that closes a decoder block, with the residual add and the next
/// RMSNorm folded in: `residual += W·x (+ bias)` for the one prepared input row of `acts`,
/// then the next products' input `norm(residual)·weight` prepared in `acts` without a launch of
/// its own. That input is left undivided by its RMS, with each 32-value group's sum of
/// squares; the products that read it divide their sums instead. `W` needs a multiple of 32
/// rows (a block of the kernel owns one group). An input of quantized weights prepared
/// unquantized ([`ActScratch::prepare_unquantized`]) is quantized by the kernel's blocks, each
/// the values it reads, into its shared memory: the quantizer's bits without its launch.
pub fn gemv_residual_norm(
    gpu: &Gpu,
    k: &MatmulKernels,
    w: &DeviceMatrix,
    bias: Option<u64>,
    acts: &mut ActScratch,
    out: &ResidualNorm,
) -> Result<(), CudaError> {
    let rows = w.rows;
    if acts.m != 1 {
        return Err(CudaError::Unsupported(format!(
            "a residual norm product of {} prepared rows: it takes one",
            acts.m
        )));
    }
    // Its blocks write the sums of squares that such an input's readers sum.
    if acts.rms_eps.is_some() {
        return Err(CudaError::Unsupported(
            "a residual norm product of an input still to be divided by its RMS".into(),
        ));
    }
    acts.check_shape(1, rows)?;
    if out.residual == 0 || out.weight == 0 || out.normed == 0 || !out.normed.is_multiple_of(16) {
        return Err(CudaError::Bounds(format!(
            "residual norm outputs {out:?}: need non-null pointers, the f32 output 16-byte \
             aligned"
        )));
    }
    if bias == Some(0) {
        return Err(CudaError::Bounds("a null bias pointer".into()));
    }
    if !(out.eps.is_finite() && out.eps >= 0.0) {
        return Err(CudaError::Bounds(format!("norm epsilon {}", out.eps)));
    }
    let tk = k.of(w.ty)?;
    // An input left unquantized: the kernel's blocks quantize it.
    let quant_in = w.ty.is_quantized() && !acts.quantized;
    let (plain, split) = if quant_in {
        (&tk.norm_q, &tk.norm_split_q)
    } else {
        (&tk.norm, &tk.norm_split)
    };
    let Some(plain) = plain else {
        return Err(CudaError::Unsupported(if tk.norm.is_none() {
            "residual norm products: the chip config leaves norms out of products".into()
        } else {
            "a residual norm product of unquantized activations: the chip config leaves \
             their quantization out of products"
                .into()
        }));
    };
    let a = if quant_in {
        acts.args_unquantized(w)?
    } else {
        acts.args(w, 1)?
    };
    let ks = norm_split(gpu, k, w, split.is_some());
    let kernel = match split {
        Some(split) if ks > 1 => split,
        _ => plain,
    };
    // The levels and sums of the input, where the blocks quantize it.
    let smem = if quant_in { norm_quant_smem(w.cols) } else { 0 };
    if smem > max_norm_quant_smem(gpu) {
        return Err(CudaError::Unsupported(format!(
            "a residual norm product quantizing {} input values: its blocks hold at most {}",
            w.cols,
            max_norm_quant_smem(gpu) * 2 / 3
        )));
    }
    let grid = rows / GROUP * ks;
    // All an SM's shared memory where few blocks leave most SMs to the next kernel (the chip
    // config's `gemv_norm_alone`).
    let alone = grid <= gpu.chip.gemv_norm_alone;
    let smem = if alone {
        max_norm_quant_smem(gpu)
    } else {
        smem
    };
    let spare = 1 - acts.cur;
    let mut gemv = GemvParams::zeroed();
    gemv.part[0] = GemvPart::of(&Product {
        w,
        y: out.normed,
        y_stride: rows,
        bias,
    });
    gemv.set_input(&a);
    gemv.cols = w.cols as i32;
    gemv.m = 1;
    gemv.ksplit = ks as i32;
    gemv.parts = 1;
    // The o product (input quantized already) releases the next kernel before its wait where
    // the chip config's `gemv_norm_release` says; the down product always after it (released
    // first, 3 % slower on qwen3-0.6b: docs/perf/2026-11-24-early-release.md).
    let release_first = !quant_in
        && match gpu.chip.gemv_norm_release {
            0 => false,
            1 => w.ty == GgmlType::Q4_0 && !alone,
            _ => true,
        };
    gemv.early = start_mode(k.early, release_first);
    gemv.blocks = (rows / GROUP) as i32;
    let params = NormParams {
        gemv,
        residual: out.residual,
        weight: out.weight,
        xf: out.normed,
        q: acts.q[spare].ptr(),
        qs: acts.s[spare].ptr(),
        ssq: acts.ssq.ptr(),
    };
    gpu.launch_cluster_with(
        kernel,
        (grid as u32, 1, 1),
        ((32 * GROUP / rows_per_warp(w.ty, 1)) as u32, 1, 1),
        smem as u32,
        ks as u32,
        &params,
    )?;
    acts.cur = spare;
    // The scratch now holds the next input: products need its `prepare` first.
    acts.m = 0;
    acts.adopted = Some(Adopted {
        x: out.normed,
        x_stride: rows,
        m: 1,
        cols: rows,
        rms_eps: Some(out.eps),
    });
    Ok(())
}

/// `out[t*out_stride + r] = act(gate_r·x[t]) * (up_r·x[t])` for the first `m` prepared input
/// rows: one launch when both matrices have the same type, else the gate product followed by
/// the up product multiplied into it.
#[allow(clippy::too_many_arguments)]
pub fn gemv_gated(
    gpu: &Gpu,
    k: &MatmulKernels,
    w_gate: &DeviceMatrix,
    w_up: &DeviceMatrix,
    acts: &ActScratch,
    m: usize,
    out: u64,
    out_stride: usize,
    act: Activation,
) -> Result<(), CudaError> {
    if w_gate.rows != w_up.rows || w_gate.cols != w_up.cols {
        return Err(CudaError::Bounds(format!(
            "gate {}x{} and up {}x{} differ in shape",
            w_gate.rows, w_gate.cols, w_up.rows, w_up.cols
        )));
    }
    check_output("gated output", out, out_stride, w_gate.rows, m)?;
    let act_code = match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    };
    if w_gate.ty != w_up.ty {
        let part = |w| Product {
            w,
            y: out,
            y_stride: out_stride,
            bias: None,
        };
        launch_gemv(gpu, k, &[part(w_gate)], acts, m, 0)?;
        return launch_gemv(gpu, k, &[part(w_up)], acts, m, 1 + act_code);
    }
    let tk = k.of(w_gate.ty)?;
    let a = acts.args(w_gate, m)?;
    let v = variant(m);
    let [data, aux, rows, cols] = w_gate.args();
    let [data2, aux2, _, _] = w_up.args();
    let (kernel, grid, warps, ks) = match k
        .mma_for(tk, m, (w_gate.rows, true), w_gate.cols)
        .and_then(|mk| mk.gated(m))
    {
        Some(kernel) => (kernel, w_gate.rows.div_ceil(16), MMA_WARPS, 1),
        None => {
            let warps = k.block_warps(w_gate.ty, M_VARIANTS[v], w_gate.cols) as usize;
            let ks = ksplit(
                w_gate.ty,
                M_VARIANTS[v],
                w_gate.rows,
                w_gate.cols,
                warps,
                k.fill_warps,
            );
            let blocks = w_gate.rows.div_ceil(warps / ks);
            let (kernel, grid) = k.launch_shape(
                gpu,
                (&tk.gated_split, &tk.gated, tk.stream(v, true)),
                v,
                ks,
                blocks,
                warps as u32,
            )?;
            (kernel, grid, warps, ks)
        }
    };
    gpu.launch(
        kernel,
        (grid as u32, 1, 1),
        (32 * warps as u32, 1, 1),
        0,
        &[
            data,
            aux,
            rows,
            cols,
            data2,
            aux2,
            Arg::Ptr(a.q),
            Arg::Ptr(a.s),
            Arg::Ptr(a.x),
            Arg::I32(a.x_stride),
            Arg::I32(m as i32),
            Arg::Ptr(out),
            Arg::I32(out_stride as i32),
            Arg::I32(act_code),
            Arg::I32(ks as i32),
            Arg::I32(k.start(w_gate.ty, M_VARIANTS[v], w_gate.cols)),
            Arg::Ptr(a.ssq),
            Arg::F32(a.eps),
        ],
    )
}

/// `out[t*cols + c] = table[tokens[t]][c] * scale` for `m` tokens, with `tokens` a device
/// array of `m` u32 and `out` a 16-byte aligned device array of `m * table.cols()` f32. A token
/// id past the table gives a zero row (the caller checks ids; the kernel never reads past the
/// table).
pub fn embed(
    gpu: &Gpu,
    k: &MatmulKernels,
    table: &DeviceMatrix,
    tokens: u64,
    m: usize,
    out: u64,
    scale: f32,
) -> Result<(), CudaError> {
    if m == 0 || m > u16::MAX as usize || tokens == 0 || out == 0 || !out.is_multiple_of(16) {
        return Err(CudaError::Bounds(format!(
            "embedding {m} tokens from {tokens:#x} into {out:#x} (needs 1..=65535 tokens and a \
             16-byte aligned output)"
        )));
    }
    let tk = k.of(table.ty)?;
    let groups = (table.cols / GROUP) as u32;
    let threads = groups.min(128);
    let [data, aux, rows, cols] = table.args();
    gpu.launch(
        &tk.embed,
        (groups.div_ceil(threads), m as u32, 1),
        (threads, 1, 1),
        0,
        &[
            data,
            aux,
            rows,
            cols,
            Arg::Ptr(tokens),
            Arg::I32(m as i32),
            Arg::Ptr(out),
            Arg::F32(scale),
        ],
    )
}

/// Where [`embed_norm`] leaves the first RMSNorm of the looked-up rows.
#[derive(Clone, Copy, Debug)]
pub struct EmbedNorm {
    /// The norm's weights, `cols` f32.
    pub weight: u64,
    pub eps: f32,
    /// `norm(row) · weight`, `m × cols` f32.
    pub normed: u64,
}

/// [`embed`] into `residual`, then `norm.normed = rms_norm(residual) · norm.weight` per row, and
/// with `quantized` (levels, sums) the int8 form of `normed` that the products read
/// ([`ActScratch::written_by`]): a pass's first three launches in one. The table needs at most
/// 1,024 groups of 32 values a row; every output and the weights 16-byte aligned.
#[allow(clippy::too_many_arguments)]
pub fn embed_norm(
    gpu: &Gpu,
    k: &MatmulKernels,
    table: &DeviceMatrix,
    tokens: u64,
    m: usize,
    residual: u64,
    scale: f32,
    norm: &EmbedNorm,
    quantized: Option<(u64, u64)>,
) -> Result<(), CudaError> {
    let groups = table.cols / GROUP;
    let (q, qs) = quantized.unwrap_or((0, 0));
    let aligned = [residual, norm.weight, norm.normed, q, qs]
        .iter()
        .all(|p| p.is_multiple_of(16));
    if m == 0
        || m > u16::MAX as usize
        || tokens == 0
        || residual == 0
        || norm.weight == 0
        || norm.normed == 0
        || quantized.is_some_and(|(q, qs)| q == 0 || qs == 0)
        || !aligned
        || !embed_norm_fits(table.cols)
    {
        return Err(CudaError::Bounds(format!(
            "embedding {m} tokens of {} values with their norm: needs 1..=65535 tokens, rows of \
             a multiple of 32 values up to {}, non-null 16-byte aligned outputs and weights",
            table.cols,
            EMBED_NORM_GROUPS * GROUP
        )));
    }
    if !(norm.eps.is_finite() && norm.eps >= 0.0) {
        return Err(CudaError::Bounds(format!("norm epsilon {}", norm.eps)));
    }
    let tk = k.of(table.ty)?;
    let [data, aux, rows, cols] = table.args();
    gpu.launch(
        &tk.embed_norm,
        (m as u32, 1, 1),
        (groups.next_multiple_of(32) as u32, 1, 1),
        0,
        &[
            data,
            aux,
            rows,
            cols,
            Arg::Ptr(tokens),
            Arg::I32(m as i32),
            Arg::Ptr(residual),
            Arg::F32(scale),
            Arg::Ptr(norm.weight),
            Arg::F32(norm.eps),
            Arg::Ptr(norm.normed),
            Arg::Ptr(q),
            Arg::Ptr(qs),
        ],
    )
}

/// The most groups of 32 values a row of [`embed_norm`] (a thread each, one block a row).
const EMBED_NORM_GROUPS: usize = 1024;

/// Whether [`embed_norm`] takes rows of `cols` values: whole groups of 32, at most
/// `EMBED_NORM_GROUPS` of them.
pub fn embed_norm_fits(cols: usize) -> bool {
    cols.is_multiple_of(GROUP) && cols / GROUP <= EMBED_NORM_GROUPS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_are_listed_for_the_supported_types_only() {
        for &ty in GgmlType::ALL {
            let listed = modules_for(&[ty]);
            let own = qtype_define(ty);
            let mine = listed.iter().filter(|(_, d)| *d == own).count();
            assert_eq!(mine, if supported(ty) { 2 } else { 0 }, "{ty}");
            let quantizer = listed.iter().any(|(_, d)| d.is_empty());
            assert_eq!(quantizer, supported(ty) && ty.is_quantized(), "{ty}");
            let gemm = crate::gemm::modules_for(&[ty]);
            assert_eq!(gemm.len(), 1, "{ty}");
            assert_eq!(gemm[0].1 == own, crate::gemm::TYPES.contains(&ty), "{ty}");
        }
    }

    #[test]
    fn layouts_cover_every_byte_of_each_block_once() {
        for &ty in SUPPORTED {
            let Some(l) = layout(ty) else {
                assert!(!ty.is_quantized());
                continue;
            };
            assert!(l.data_bytes.is_multiple_of(16), "{ty}");
            let mut seen = vec![0u8; ty.type_size()];
            let mut data = 0;
            for &(src, len) in l.data {
                seen[src..src + len].iter_mut().for_each(|s| *s += 1);
                data += len;
            }
            assert_eq!(data, l.data_bytes, "{ty}");
            for &(src, dst, len) in l.aux {
                assert!(dst + len <= l.aux_bytes, "{ty}");
                seen[src..src + len].iter_mut().for_each(|s| *s += 1);
            }
            if let Some((src, len)) = l.aux2 {
                seen[src..src + len].iter_mut().for_each(|s| *s += 1);
            }
            assert!(seen.iter().all(|&s| s == 1), "{ty}: {seen:?}");
        }
    }

    #[test]
    fn only_narrow_single_token_products_release_first() {
        // Rows of at most one chunk a lane: 1,024 values of Q4_0 (qwen3-0.6b), 2,048 of Q4_K.
        assert!(narrow(GgmlType::Q4_0, 1, 1024));
        assert!(!narrow(GgmlType::Q4_0, 1, 2048));
        assert!(!narrow(GgmlType::Q4_0, 2, 1024));
        assert!(narrow(GgmlType::Q4_K, 1, 2048));
        assert!(!narrow(GgmlType::Q4_K, 1, 2560));
        assert_eq!(start_mode(true, false), 1);
        assert_eq!(start_mode(true, true), 2);
        // Without early loads every product waits first.
        assert_eq!(start_mode(false, true), 0);
    }

    #[test]
    fn embed_norm_takes_whole_groups_up_to_a_block() {
        assert!(embed_norm_fits(640));
        assert!(embed_norm_fits(32 * 1024));
        assert!(!embed_norm_fits(32 * 1025));
        assert!(!embed_norm_fits(650));
    }

    #[test]
    fn tensor_core_batch_settings_are_never_or_from_two_tokens() {
        assert_eq!(mma_from_setting(0), 0);
        assert_eq!(mma_from_setting(1), 2);
        assert_eq!(mma_from_setting(2), 2);
        assert_eq!(mma_from_setting(5), 5);
    }

    #[test]
    fn batch_variants() {
        assert_eq!(variant(1), 0);
        assert_eq!(variant(2), 1);
        assert_eq!(variant(3), 2);
        assert_eq!(variant(5), 3);
        assert_eq!(variant(9), 4);
        assert_eq!(variant(16), 4);
    }
}

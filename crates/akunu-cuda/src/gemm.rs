//! Prefill matrix products on tensor cores: `Y[t][r] = Σ_c W[r][c]·X[t][c] (+ bias[r])` for
//! many tokens at once, with the weights still quantized.
//!
//! Plan (details in `kernels/gemm.cu`): [`prepare`] converts the f32 activations once into an
//! f16 copy in a [`GemmScratch`] (each token row scaled by a power of two that keeps it inside
//! f16's range), so products that share an input (q/k/v, gate/up) convert it once; then
//! [`gemm_prepared`] runs one block per tile of 128 (or 64) tokens × 128 weight rows. A block
//! dequantizes its weight rows 64 columns at a time into shared memory as f16, streams the
//! activation tile in with `cp.async`, and multiplies with `mma.sync.m16n8k16` (f16 operands,
//! f32 accumulation), double-buffered. [`gemm_many`] puts the tiles of up to three same-type
//! matrices in one grid, so small products fill the SMs together. [`gemm`] does both steps.
//! Any `m ≥ 1`, any number of rows and any `cols` that is a multiple of 32 are handled; no
//! launch allocates or synchronizes.

use std::sync::{Arc, Mutex};

use akunu_quant::GgmlType;

use bytemuck::{Pod, Zeroable};

use crate::compile::ModuleSpec;
use crate::gpu::{Arg, DeviceBuffer, Gpu, Kernel};
use crate::matmul::{for_each_launch, launch_type, DeviceMatrix, Product, MAX_PARTS};
use crate::CudaError;

/// Every weight type the GEMM kernels are compiled for.
pub const TYPES: &[GgmlType] = &[
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

const FILE: &str = "gemm.cu";
const THREADS: u32 = 256;
/// Weight rows per block (the kernels' `GEMM_BN`).
const BN: usize = 128;
/// Bytes of one shared-memory tile row: 64 f16 of K.
const TILE_ROW_BYTES: usize = 128;
/// Alignment of the f32 scale array behind the f16 activations in the scratch.
const SCALE_ALIGN: usize = 256;

fn defines(ty: GgmlType) -> Vec<(&'static str, String)> {
    vec![("QTYPE", (ty as u32).to_string())]
}

/// Every module variant [`GemmKernels::new`] can ask for: `gemm.cu` once per weight type.
pub fn modules() -> Vec<ModuleSpec> {
    modules_for(TYPES)
}

/// The modules [`GemmKernels::new`] compiles for `types` (none for a type it refuses).
pub fn modules_for(types: &[GgmlType]) -> Vec<ModuleSpec> {
    let mut known: Vec<GgmlType> = types
        .iter()
        .copied()
        .filter(|t| TYPES.contains(t))
        .collect();
    if known.is_empty() {
        known.push(GgmlType::F32);
    }
    known.into_iter().map(|t| (FILE, defines(t))).collect()
}

/// Dynamic shared memory of the kernel with `bm` tokens per block: two stages of an activation
/// tile (`bm` rows) and a weight tile (128 rows), 128 bytes a row.
fn smem_bytes(bm: usize) -> usize {
    2 * (bm + BN) * TILE_ROW_BYTES
}

/// Tokens per block tile, and blocks per SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTile {
    /// By the grid's size in 128-token tiles: [`GemmTile::Tokens128Pair`] when it fills every
    /// SM, [`GemmTile::Tokens128`] when it fills half of them, else [`GemmTile::Tokens64`]
    /// (fewer tokens or fewer rows).
    Auto,
    /// 64-token tiles, two blocks per SM.
    Tokens64,
    /// 128-token tiles, one block per SM with all the registers it wants.
    Tokens128,
    /// 128-token tiles, two blocks per SM in 128 registers a thread.
    Tokens128Pair,
}

struct TypeKernels {
    ty: GgmlType,
    m128: Kernel,
    m128_pair: Kernel,
    m64: Kernel,
}

/// The GEMM kernels for a set of weight types, resolved once.
pub struct GemmKernels {
    prep: Kernel,
    types: Vec<TypeKernels>,
    sm_count: usize,
    tile: GemmTile,
}

impl GemmKernels {
    /// Compiles (or loads) the kernels for `types`; the activation conversion comes from the
    /// first type's module (F32's when `types` is empty).
    pub fn new(gpu: &Arc<Gpu>, types: &[GgmlType]) -> Result<GemmKernels, CudaError> {
        let (major, _) = gpu.chip.compute_capability;
        if major < 8 {
            return Err(CudaError::Unsupported(format!(
                "tensor-core GEMM needs compute capability 8.0 or newer (cp.async, mma.sync); \
                 this GPU is {}.{}",
                gpu.chip.compute_capability.0, gpu.chip.compute_capability.1
            )));
        }
        let need = smem_bytes(128);
        if gpu.chip.smem_per_block < need {
            return Err(CudaError::Unsupported(format!(
                "the GEMM needs {need} bytes of shared memory per block, the GPU allows {}",
                gpu.chip.smem_per_block
            )));
        }
        let mut list: Vec<TypeKernels> = Vec::new();
        for &ty in types {
            if list.iter().any(|k| k.ty == ty) {
                continue;
            }
            if !TYPES.contains(&ty) {
                return Err(CudaError::Unsupported(format!(
                    "no GEMM kernel for {ty} weights"
                )));
            }
            let d = defines(ty);
            let m128 = gpu.kernel(FILE, "gemm_m128", &d)?;
            m128.set_max_dynamic_smem(smem_bytes(128))?;
            let m128_pair = gpu.kernel(FILE, "gemm_m128_pair", &d)?;
            m128_pair.set_max_dynamic_smem(smem_bytes(128))?;
            let m64 = gpu.kernel(FILE, "gemm_m64", &d)?;
            m64.set_max_dynamic_smem(smem_bytes(64))?;
            list.push(TypeKernels {
                ty,
                m128,
                m128_pair,
                m64,
            });
        }
        let prep_ty = types.first().copied().unwrap_or(GgmlType::F32);
        let prep = gpu.kernel(FILE, "gemm_prep_x", &defines(prep_ty))?;
        Ok(GemmKernels {
            prep,
            types: list,
            sm_count: gpu.chip.sm_count,
            tile: GemmTile::Auto,
        })
    }

    /// Fixes the tile size (for tuning and tests); [`GemmTile::Auto`] by default.
    pub fn set_tile(&mut self, tile: GemmTile) {
        self.tile = tile;
    }

    fn for_type(&self, ty: GgmlType) -> Result<&TypeKernels, CudaError> {
        self.types
            .iter()
            .find(|k| k.ty == ty)
            .ok_or_else(|| CudaError::Unsupported(format!("GEMM kernels were not built for {ty}")))
    }
}

/// Device scratch for the f16 copy of the activations (`max_m` × `max_cols`) and one f32 scale
/// per token; remembers the shape [`prepare`] last put there (launches are ordered on the one
/// stream, so that is what the following products read).
pub struct GemmScratch {
    buf: DeviceBuffer,
    max_m: usize,
    max_cols: usize,
    scale_offset: usize,
    prepared: Mutex<Option<(usize, usize)>>,
}

impl GemmScratch {
    pub fn new(gpu: &Gpu, max_m: usize, max_cols: usize) -> Result<GemmScratch, CudaError> {
        let too_big = || CudaError::Bounds(format!("GEMM scratch of {max_m} x {max_cols}"));
        let half_bytes = max_m
            .checked_mul(max_cols)
            .and_then(|n| n.checked_mul(2))
            .ok_or_else(too_big)?;
        let scale_offset = half_bytes.div_ceil(SCALE_ALIGN) * SCALE_ALIGN;
        let total = max_m
            .checked_mul(4)
            .and_then(|n| n.checked_add(scale_offset))
            .ok_or_else(too_big)?;
        Ok(GemmScratch {
            buf: gpu.alloc(total)?,
            max_m,
            max_cols,
            scale_offset,
            prepared: Mutex::new(None),
        })
    }

    /// `(m, cols)` of the activations [`prepare`] last converted.
    pub fn prepared(&self) -> Option<(usize, usize)> {
        *self.prepared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_prepared(&self, shape: Option<(usize, usize)>) {
        *self.prepared.lock().unwrap_or_else(|e| e.into_inner()) = shape;
    }

    fn halves(&self) -> u64 {
        self.buf.ptr()
    }

    fn scales(&self) -> u64 {
        self.buf.at(self.scale_offset)
    }
}

fn to_i32(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("{what} {v} exceeds i32")))
}

fn to_i64(v: usize, what: &str) -> Result<i64, CudaError> {
    i64::try_from(v).map_err(|_| CudaError::Unsupported(format!("{what} {v} exceeds i64")))
}

/// Converts `m` rows of `cols` f32 activations at `x` (row stride `x_stride` floats) into
/// `scratch` for the following [`gemm_prepared`] calls.
pub fn prepare(
    gpu: &Gpu,
    k: &GemmKernels,
    x: u64,
    x_stride: usize,
    m: usize,
    cols: usize,
    scratch: &GemmScratch,
) -> Result<(), CudaError> {
    scratch.set_prepared(None);
    if cols == 0 || !cols.is_multiple_of(32) {
        return Err(CudaError::Bounds(format!(
            "GEMM input width {cols} is not a positive multiple of 32"
        )));
    }
    if x_stride < cols {
        return Err(CudaError::Bounds(format!(
            "input row stride {x_stride} is shorter than a row of {cols}"
        )));
    }
    if m > scratch.max_m || cols > scratch.max_cols {
        return Err(CudaError::Bounds(format!(
            "{m} x {cols} activations do not fit a GEMM scratch of {} x {}",
            scratch.max_m, scratch.max_cols
        )));
    }
    if m > 0 && x == 0 {
        return Err(CudaError::Bounds("null GEMM input".into()));
    }
    let vec = x.is_multiple_of(16) && x_stride.is_multiple_of(4);
    let args = [
        Arg::Ptr(x),
        Arg::I64(to_i64(x_stride, "input row stride")?),
        Arg::I32(to_i32(cols, "input width")?),
        Arg::I32(vec as i32),
        Arg::Ptr(scratch.halves()),
        Arg::Ptr(scratch.scales()),
    ];
    let grid =
        u32::try_from(m).map_err(|_| CudaError::Unsupported(format!("{m} tokens in one GEMM")))?;
    gpu.launch(&k.prep, (grid, 1, 1), (THREADS, 1, 1), 0, &args)?;
    scratch.set_prepared(Some((m, cols)));
    Ok(())
}

/// `y[t·y_stride + r] = Σ_c W[r][c]·x[t][c] (+ bias[r])` for the activations in `scratch`
/// (converted by [`prepare`]); `bias` holds `w.rows()` f32.
pub fn gemm_prepared(
    gpu: &Gpu,
    k: &GemmKernels,
    w: &DeviceMatrix,
    scratch: &GemmScratch,
    y: u64,
    y_stride: usize,
    bias: Option<u64>,
) -> Result<(), CudaError> {
    let product = Product {
        w,
        y,
        y_stride,
        bias,
    };
    launch_gemm(gpu, k, &[product], scratch)
}

/// The products of several matrices with the activations in `scratch`: each run of one weight
/// type, up to [`MAX_PARTS`], in one launch (its tiles fill the SMs together).
pub fn gemm_many(
    gpu: &Gpu,
    k: &GemmKernels,
    products: &[Product],
    scratch: &GemmScratch,
) -> Result<(), CudaError> {
    for_each_launch(products, MAX_PARTS, |run| launch_gemm(gpu, k, run, scratch))
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemmPart {
    data: u64,
    aux: u64,
    y: u64,
    bias: u64,
    y_stride: i64,
    rows: i32,
    first_tile: i32,
}

/// The kernels' one parameter (`GemmParams` in `kernels/gemm.cu`).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemmParams {
    part: [GemmPart; MAX_PARTS],
    xh: u64,
    xscale: u64,
    m: i32,
    cols: i32,
    parts: i32,
    pad: i32,
}

/// One launch over `products` (one weight type, at most [`MAX_PARTS`]).
fn launch_gemm(
    gpu: &Gpu,
    k: &GemmKernels,
    products: &[Product],
    scratch: &GemmScratch,
) -> Result<(), CudaError> {
    let Some((m, cols)) = scratch.prepared() else {
        return Err(CudaError::Bounds(
            "GEMM scratch holds no prepared input".into(),
        ));
    };
    let Some(ty) = launch_type(products)? else {
        return Ok(());
    };
    let mut params = GemmParams::zeroed();
    let mut tiles = 0;
    for (part, p) in params.part.iter_mut().zip(products) {
        let rows = p.w.rows();
        if cols != p.w.cols() {
            return Err(CudaError::Bounds(format!(
                "prepared input has {cols} columns, the matrix {}",
                p.w.cols()
            )));
        }
        if p.y_stride < rows {
            return Err(CudaError::Bounds(format!(
                "output row stride {} is shorter than a row of {rows}",
                p.y_stride
            )));
        }
        if p.y == 0 || p.bias == Some(0) {
            return Err(CudaError::Bounds("null GEMM output or bias".into()));
        }
        *part = GemmPart {
            data: p.w.data_ptr(),
            aux: p.w.aux_ptr(),
            y: p.y,
            bias: p.bias.unwrap_or(0),
            y_stride: to_i64(p.y_stride, "output row stride")?,
            rows: to_i32(rows, "row count")?,
            first_tile: to_i32(tiles, "row tiles")?,
        };
        tiles += rows.div_ceil(BN);
    }
    if m == 0 || tiles == 0 {
        return Ok(());
    }
    if tiles > 65535 {
        return Err(CudaError::Unsupported(format!(
            "{tiles} tiles of 128 rows in one GEMM"
        )));
    }
    let tk = k.for_type(ty)?;
    let tile = match k.tile {
        GemmTile::Auto => {
            // Measured on an H200 (docs/perf): a 64-token tile dequantizes each weight twice as
            // often, so it only wins where 128-token tiles would leave most SMs idle.
            let blocks = m.div_ceil(128) * tiles;
            if blocks >= k.sm_count {
                GemmTile::Tokens128Pair
            } else if m > 64 && 2 * blocks >= k.sm_count {
                GemmTile::Tokens128
            } else {
                GemmTile::Tokens64
            }
        }
        fixed => fixed,
    };
    let (kernel, bm) = match tile {
        GemmTile::Tokens128 => (&tk.m128, 128),
        GemmTile::Tokens128Pair => (&tk.m128_pair, 128),
        _ => (&tk.m64, 64),
    };
    let grid_x = u32::try_from(m.div_ceil(bm))
        .map_err(|_| CudaError::Unsupported(format!("{m} tokens in one GEMM")))?;
    params.xh = scratch.halves();
    params.xscale = scratch.scales();
    params.m = to_i32(m, "token count")?;
    params.cols = to_i32(cols, "input width")?;
    params.parts = products.len() as i32;
    gpu.launch_with(
        kernel,
        (grid_x, tiles as u32, 1),
        (THREADS, 1, 1),
        smem_bytes(bm) as u32,
        &params,
    )
}

/// [`prepare`] then [`gemm_prepared`]: `y[t·y_stride + r] = Σ_c W[r][c]·x[t·x_stride + c]
/// (+ bias[r])` for `t < m`.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    gpu: &Gpu,
    k: &GemmKernels,
    w: &DeviceMatrix,
    x: u64,
    x_stride: usize,
    m: usize,
    y: u64,
    y_stride: usize,
    bias: Option<u64>,
    scratch: &GemmScratch,
) -> Result<(), CudaError> {
    prepare(gpu, k, x, x_stride, m, w.cols(), scratch)?;
    gemm_prepared(gpu, k, w, scratch, y, y_stride, bias)
}

//! Times the FlashAttention kernels on the attention shapes of BENCHMARKS.md and prints one
//! JSON line per shape, for `scripts/gpu/flash_bench.py` to set beside PyTorch's SDPA.
//!
//!   flash-bench [--dtype bf16|f16] [--iters N] [--warmup N] [--shapes prefill,decode]
//!               [--head-dim D] [--flush write|read] [--timeline DIR]
//!
//! Each shape is checked first: a few (token, head) rows of the output against an f32 host
//! reference; a row out of tolerance puts an `error` beside the timing. A time is the median
//! over `iters` runs, each between two events, with L2 flushed before it, so decode reads K
//! and V from memory and not from the cache lines the previous run left. The flush either
//! writes twice the L2's size (L2 is left full of dirty lines, which the timed kernel pays to
//! write back) or reads it (L2 is left clean, as a decode step finds it after the weight
//! reads of its projections). FLOPs count
//! 4·B·H·S²·D, halved when causal; decode GB/s counts the K and V bytes read.
//!
//! With `--timeline DIR`, each shape also runs once on a timeline build (`Timeline` in
//! flash.cu): the wgmma prefill kernel's blocks record when each step waits, issues and gets
//! its scores, the decode kernel's (after a flush, as timed) when the rows, the first tile,
//! the last step and the stores came and when the block ended; the records go to
//! `DIR/<shape>.timeline` for `scripts/gpu/flash_timeline.py`.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use akunu_cuda::flash::{
    timeline_bytes, FlashArgs, FlashConfig, FlashDtype, FlashKernels, FlashScratch, Queries,
    TIMELINE_RECORDS, TIMELINE_STREAMS,
};
use akunu_cuda::{DeviceBuffer, Gpu};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use half::{bf16, f16};

type Res<T> = Result<T, Box<dyn Error>>;

const USAGE: &str =
    "usage: flash-bench [--dtype bf16|f16] [--iters N] [--warmup N] [--shapes prefill,decode] \
     [--head-dim D] [--flush write|read] [--timeline DIR]";

/// Both dtypes are two bytes, and so is the output.
const ELEM_BYTES: usize = 2;

/// Rows of the output compared with the host reference per shape.
const CHECKED_ROWS: usize = 8;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Prefill,
    Decode,
}

/// B sequences of `s` queries each, the last at position `kv - 1`, over `kv` keys per
/// sequence; H query heads share `hkv` K/V heads; head size `d` for Q, K and V.
#[derive(Clone, Copy)]
struct Shape {
    kind: Kind,
    b: usize,
    h: usize,
    hkv: usize,
    s: usize,
    kv: usize,
    d: usize,
    causal: bool,
}

const fn prefill(b: usize, h: usize, s: usize, d: usize, causal: bool) -> Shape {
    Shape {
        kind: Kind::Prefill,
        b,
        h,
        hkv: h,
        s,
        kv: s,
        d,
        causal,
    }
}

const fn decode(b: usize, h: usize, hkv: usize, kv: usize, d: usize) -> Shape {
    Shape {
        kind: Kind::Decode,
        b,
        h,
        hkv,
        s: 1,
        kv,
        d,
        causal: true,
    }
}

/// The rows of the attention tables in BENCHMARKS.md, in their order, then prefill at head size
/// 256 (Gemma's) and batch 8 at 4K keys, where decode is to beat cuDNN as at batch 1.
const SHAPES: &[Shape] = &[
    prefill(1, 32, 4096, 128, true),
    prefill(1, 32, 4096, 128, false),
    prefill(4, 32, 2048, 128, true),
    prefill(1, 32, 16384, 128, true),
    prefill(1, 32, 8192, 64, true),
    prefill(1, 16, 4096, 256, true),
    decode(1, 32, 8, 4096, 128),
    decode(1, 32, 8, 32768, 128),
    decode(1, 32, 8, 131072, 128),
    decode(8, 32, 8, 4096, 128),
    decode(8, 32, 8, 8192, 128),
];

impl Shape {
    fn tokens(&self) -> usize {
        self.b * self.s
    }

    fn flops(&self) -> f64 {
        let full = 4.0 * (self.b * self.h) as f64 * (self.s * self.kv) as f64 * self.d as f64;
        if self.causal && self.kind == Kind::Prefill {
            full / 2.0
        } else {
            full
        }
    }

    /// The file name of this shape's timeline.
    fn timeline_name(&self) -> String {
        match self.kind {
            Kind::Prefill => {
                let mask = if self.causal { "causal" } else { "full" };
                format!(
                    "prefill-b{}-h{}-s{}-d{}-{mask}.timeline",
                    self.b, self.h, self.s, self.d
                )
            }
            Kind::Decode => format!(
                "decode-b{}-h{}-{}-kv{}-d{}.timeline",
                self.b, self.h, self.hkv, self.kv, self.d
            ),
        }
    }

    /// The prefill query runs: each sequence's `s` tokens.
    fn runs(&self) -> Vec<(usize, usize)> {
        (0..self.b).map(|b| (b * self.s, self.s)).collect()
    }

    /// How the kernels take this shape's queries: prefill in `runs` (`Shape::runs`), decode
    /// one token per sequence.
    fn queries<'a>(&self, runs: &'a [(usize, usize)]) -> Queries<'a> {
        match self.kind {
            Kind::Prefill => Queries::Runs(runs),
            Kind::Decode => Queries::PerToken,
        }
    }

    fn kv_bytes(&self, elem: usize) -> f64 {
        (2 * self.b * self.hkv * self.kv * self.d * elem) as f64
    }

    /// The fields that name the shape, opening its JSON line.
    fn json_key(&self, dtype: Dtype) -> String {
        let (kind, len) = match self.kind {
            Kind::Prefill => ("prefill", format!(r#""s":{}"#, self.s)),
            Kind::Decode => ("decode", format!(r#""kv":{}"#, self.kv)),
        };
        let mut key = format!(
            r#""kind":"{kind}","b":{},"h":{},"hkv":{},{len},"d":{}"#,
            self.b, self.h, self.hkv, self.d
        );
        if self.kind == Kind::Prefill {
            key += &format!(r#","causal":{}"#, self.causal);
        }
        key + &format!(r#","dtype":"{}""#, dtype.name())
    }
}

#[derive(Clone, Copy)]
enum Dtype {
    Bf16,
    F16,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    fn flash(self) -> FlashDtype {
        match self {
            Dtype::Bf16 => FlashDtype::Bf16,
            Dtype::F16 => FlashDtype::F16,
        }
    }

    fn bits(self, x: f32) -> u16 {
        match self {
            Dtype::Bf16 => bf16::from_f32(x).to_bits(),
            Dtype::F16 => f16::from_f32(x).to_bits(),
        }
    }

    fn value(self, bits: u16) -> f32 {
        match self {
            Dtype::Bf16 => bf16::from_bits(bits).to_f32(),
            Dtype::F16 => f16::from_bits(bits).to_f32(),
        }
    }

    /// Allowed |ours - reference| is `atol + rtol·|reference|`: the output's own rounding
    /// plus the rounding of the probabilities before the P·V product.
    fn tolerance(self) -> (f32, f32) {
        match self {
            Dtype::Bf16 => (1e-2, 2e-2),
            Dtype::F16 => (2e-3, 5e-3),
        }
    }
}

struct Options {
    dtype: Dtype,
    iters: usize,
    warmup: usize,
    kinds: Vec<Kind>,
    /// Only the shapes of this head size (a profiler then sees only their launches).
    head_dim: Option<usize>,
    flush: FlushKind,
    /// Where prefill shapes' timelines go, if anywhere.
    timeline: Option<PathBuf>,
}

impl Options {
    fn selects(&self, s: &Shape) -> bool {
        self.kinds.contains(&s.kind) && self.head_dim.is_none_or(|d| s.d == d)
    }
}

/// The options, or `None` when help was asked for.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        dtype: Dtype::Bf16,
        iters: 50,
        warmup: 10,
        kinds: vec![Kind::Prefill, Kind::Decode],
        head_dim: None,
        flush: FlushKind::Write,
        timeline: None,
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dtype" => {
                o.dtype = match value()?.as_str() {
                    "bf16" => Dtype::Bf16,
                    "f16" => Dtype::F16,
                    other => return Err(format!("--dtype {other}: expected bf16 or f16")),
                }
            }
            "--iters" | "--warmup" => {
                let v = value()?;
                let n = v
                    .parse::<usize>()
                    .map_err(|_| format!("{flag} {v}: expected a whole number"))?;
                if flag == "--iters" {
                    if n == 0 {
                        return Err("--iters must be at least 1".into());
                    }
                    o.iters = n;
                } else {
                    o.warmup = n;
                }
            }
            "--shapes" => {
                o.kinds = value()?
                    .split(',')
                    .map(|k| match k.trim() {
                        "prefill" => Ok(Kind::Prefill),
                        "decode" => Ok(Kind::Decode),
                        other => Err(format!("--shapes {other}: expected prefill or decode")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--head-dim" => {
                let v = value()?;
                let d = v
                    .parse::<usize>()
                    .map_err(|_| format!("--head-dim {v}: expected a whole number"))?;
                o.head_dim = Some(d);
            }
            "--flush" => {
                o.flush = match value()?.as_str() {
                    "write" => FlushKind::Write,
                    "read" => FlushKind::Read,
                    other => return Err(format!("--flush {other}: expected write or read")),
                }
            }
            "--timeline" => o.timeline = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !SHAPES.iter().any(|s| o.selects(s)) {
        return Err("no shape of the selected kinds has that head size".into());
    }
    Ok(Some(o))
}

/// Values uniform in [-1, 1) as `dtype` bits, a pure function of `seed` and the index, so the
/// threads that fill a large tensor need no shared state.
fn random(n: usize, seed: u64, dtype: Dtype) -> Vec<u16> {
    let mut out = vec![0u16; n];
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let chunk = n.div_ceil(threads).max(1 << 16);
    std::thread::scope(|scope| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    let mut z = seed
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        .wrapping_add((c * chunk + i) as u64)
                        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^= z >> 31;
                    let unit = (z >> 40) as f32 / (1u64 << 24) as f32;
                    *x = dtype.bits(2.0 * unit - 1.0);
                }
            });
        }
    });
    out
}

/// Q `[token][head][d]`, K and V `[sequence][kv head][position][d]`, as `dtype` bits.
struct Host {
    dtype: Dtype,
    q: Vec<u16>,
    k: Vec<u16>,
    v: Vec<u16>,
    scale: f32,
}

impl Host {
    fn random(sh: &Shape, dtype: Dtype) -> Host {
        let kv = sh.b * sh.hkv * sh.kv * sh.d;
        Host {
            dtype,
            q: random(sh.tokens() * sh.h * sh.d, 1, dtype),
            k: random(kv, 2, dtype),
            v: random(kv, 3, dtype),
            scale: 1.0 / (sh.d as f32).sqrt(),
        }
    }

    /// Row (`token`, `head`) of the output in f32.
    fn reference(&self, sh: &Shape, token: usize, head: usize) -> Vec<f32> {
        let (d, value) = (sh.d, |x: u16| self.dtype.value(x));
        let seq = token / sh.s;
        let pos = sh.kv - sh.s + token % sh.s;
        let keys = if sh.causal { pos + 1 } else { sh.kv };
        let base = (seq * sh.hkv + head / (sh.h / sh.hkv)) * sh.kv * d;
        let qo = (token * sh.h + head) * d;
        let q: Vec<f32> = self.q[qo..qo + d].iter().map(|&x| value(x)).collect();
        let scores: Vec<f32> = (0..keys)
            .map(|j| {
                let k = &self.k[base + j * d..][..d];
                self.scale * q.iter().zip(k).map(|(a, &b)| a * value(b)).sum::<f32>()
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut out = vec![0f32; d];
        let mut total = 0f32;
        for (j, s) in scores.iter().enumerate() {
            let p = (s - max).exp();
            total += p;
            for (o, &v) in out.iter_mut().zip(&self.v[base + j * d..][..d]) {
                *o += p * value(v);
            }
        }
        out.iter().map(|o| o / total).collect()
    }
}

/// The host data, device buffers holding the same bits, and the launch arguments.
struct Problem {
    host: Host,
    args: FlashArgs,
    out: DeviceBuffer,
    _device: Vec<DeviceBuffer>,
}

impl Problem {
    fn new(gpu: &Gpu, sh: &Shape, dtype: Dtype) -> Res<Problem> {
        let (n, d) = (sh.tokens(), sh.d);
        let host = Host::random(sh, dtype);
        let q_pos: Vec<u32> = (0..n).map(|t| (sh.kv - sh.s + t % sh.s) as u32).collect();
        let q_seq: Vec<u32> = (0..n).map(|t| (t / sh.s) as u32).collect();
        let bufs = [
            gpu.upload(&host.q)?,
            gpu.upload(&host.k)?,
            gpu.upload(&host.v)?,
            gpu.upload(&q_pos)?,
            gpu.upload(&q_seq)?,
        ];
        let out = gpu.alloc(n * sh.h * d * ELEM_BYTES)?;
        let kv_stride = [sh.hkv * sh.kv * d, sh.kv * d, d];
        let args = FlashArgs {
            q: bufs[0].ptr(),
            k: bufs[1].ptr(),
            v: bufs[2].ptr(),
            out: out.ptr(),
            n_tokens: n,
            n_head: sh.h,
            n_head_kv: sh.hkv,
            n_ctx: sh.kv,
            q_stride: [sh.h * d, d],
            k_stride: kv_stride,
            v_stride: kv_stride,
            out_stride: [sh.h * d, d],
            q_pos: bufs[3].ptr(),
            q_seq: bufs[4].ptr(),
            // Every sequence holds n_ctx keys, so no lengths (kv_len 0), as the engine's decode
            // passes none: the kernel then reads no length behind the token's sequence.
            kv_len: 0,
            causal: sh.causal,
            scale: host.scale,
            ..FlashArgs::default()
        };
        Ok(Problem {
            host,
            args,
            out,
            _device: bufs.into(),
        })
    }

    /// The largest error over a spread of rows (the last token's among them), or which element
    /// of which row is out of tolerance.
    fn check(&self, gpu: &Gpu, sh: &Shape) -> Res<Result<f32, String>> {
        let (n, d) = (sh.tokens(), sh.d);
        let dtype = self.host.dtype;
        let (atol, rtol) = dtype.tolerance();
        let mut worst = 0f32;
        for i in 0..CHECKED_ROWS {
            let token = if i == 0 {
                n - 1
            } else {
                (i * n) / CHECKED_ROWS
            };
            let head = (i * (sh.h - 1)) / (CHECKED_ROWS - 1);
            let mut got = vec![0u16; d];
            gpu.read(&self.out, (token * sh.h + head) * d * ELEM_BYTES, &mut got)?;
            let want = self.host.reference(sh, token, head);
            for (j, (&g, &r)) in got.iter().zip(&want).enumerate() {
                let g = dtype.value(g);
                let err = (g - r).abs();
                if err.is_nan() || err > atol + rtol * r.abs() {
                    return Ok(Err(format!(
                        "token {token} head {head} element {j}: got {g}, expected {r}"
                    )));
                }
                worst = worst.max(err);
            }
        }
        Ok(Ok(worst))
    }
}

/// How the L2 is emptied before each timed run.
#[derive(Clone, Copy, PartialEq, Debug)]
enum FlushKind {
    /// Twice the L2's size written: the lines left are dirty.
    Write,
    /// Twice the L2's size read: the lines left are clean.
    Read,
}

/// Bytes a read flush copies at a time, all into one small window, so the only lines it
/// dirties are the window's.
const READ_WINDOW: usize = 1 << 20;

/// A buffer of four times the L2 size. Either flush evicts everything an earlier run left in
/// L2: a write flush copies the buffer's first half over its second; a read flush copies twice
/// the L2's size, a window at a time, into one window at the buffer's start.
struct Flush {
    buf: DeviceBuffer,
    kind: FlushKind,
}

impl Flush {
    fn new(gpu: &Gpu, kind: FlushKind) -> Res<Flush> {
        let l2 = gpu.chip.l2_bytes.max(1 << 20).next_multiple_of(READ_WINDOW);
        Ok(Flush {
            buf: gpu.alloc(4 * l2)?,
            kind,
        })
    }

    fn run(&self, gpu: &Gpu) -> Res<()> {
        let half = self.buf.bytes() / 2;
        match self.kind {
            FlushKind::Write => gpu.copy(self.buf.at(half), self.buf.ptr(), half)?,
            FlushKind::Read => {
                for at in (READ_WINDOW..READ_WINDOW + half).step_by(READ_WINDOW) {
                    gpu.copy(self.buf.ptr(), self.buf.at(at), READ_WINDOW)?;
                }
            }
        }
        Ok(())
    }
}

fn event(gpu: &Gpu) -> Res<CudaEvent> {
    Ok(gpu
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
}

struct Measured {
    us: f64,
    max_err: Result<f32, String>,
}

fn measure(gpu: &Gpu, sh: &Shape, o: &Options, flush: &Flush) -> Res<Measured> {
    let p = Problem::new(gpu, sh, o.dtype)?;
    let kernels = FlashKernels::new(gpu, FlashConfig::new(o.dtype.flash(), sh.d, sh.d))?;
    let runs = sh.runs();
    let queries = || sh.queries(&runs);
    let scratch = FlashScratch::new(gpu, kernels.scratch_bytes(&p.args, &queries(), sh.kv))?;
    let run = || kernels.run(gpu, &p.args, queries(), sh.kv, &scratch);
    run()?;
    gpu.sync()?;
    let max_err = p.check(gpu, sh)?;
    for _ in 0..o.warmup {
        run()?;
    }
    let marks: Vec<(CudaEvent, CudaEvent)> = (0..o.iters)
        .map(|_| Ok((event(gpu)?, event(gpu)?)))
        .collect::<Res<_>>()?;
    for (start, end) in &marks {
        flush.run(gpu)?;
        start.record(gpu.stream())?;
        run()?;
        end.record(gpu.stream())?;
    }
    gpu.sync()?;
    let mut ms = marks
        .iter()
        .map(|(start, end)| start.elapsed_ms(end))
        .collect::<Result<Vec<f32>, _>>()?;
    ms.sort_by(f32::total_cmp);
    let mid = ms.len() / 2;
    let median = if ms.len() % 2 == 1 {
        ms[mid] as f64
    } else {
        (ms[mid - 1] as f64 + ms[mid] as f64) / 2.0
    };
    Ok(Measured {
        us: median * 1e3,
        max_err,
    })
}

/// First word of a timeline file: "AKTL" in little-endian bytes.
const TIMELINE_MAGIC: u32 = u32::from_le_bytes(*b"AKTL");

/// The shape once on the timeline build, its records written to `dir`: a header of four u32
/// (magic, blocks, streams a block, records a stream), then each stream's (clock, event)
/// pairs. `None` when no block recorded anything (the shape ran on another kernel). Records
/// cover as many blocks as SMs: a wgmma prefill launch's persistent blocks, and a decode
/// launch's first blocks by index (all of them on these shapes, one block per SM).
fn record_timeline(
    gpu: &Gpu,
    sh: &Shape,
    o: &Options,
    dir: &Path,
    flush: &Flush,
) -> Res<Option<PathBuf>> {
    let mut p = Problem::new(gpu, sh, o.dtype)?;
    let cfg = FlashConfig::new(o.dtype.flash(), sh.d, sh.d).with_timeline();
    let kernels = FlashKernels::new(gpu, cfg)?;
    let runs = sh.runs();
    let queries = || sh.queries(&runs);
    let scratch = FlashScratch::new(gpu, kernels.scratch_bytes(&p.args, &queries(), sh.kv))?;
    let blocks = gpu.chip.sm_count;
    p.args.debug_steps = blocks;
    // The first run compiles and warms; the second records into a buffer cleared for it,
    // after a flush as a timed run.
    let warm = gpu.alloc(timeline_bytes(blocks))?;
    p.args.debug = warm.ptr();
    kernels.run(gpu, &p.args, queries(), sh.kv, &scratch)?;
    let buf = gpu.alloc(timeline_bytes(blocks))?;
    p.args.debug = buf.ptr();
    flush.run(gpu)?;
    kernels.run(gpu, &p.args, queries(), sh.kv, &scratch)?;
    let mut records = vec![0u32; timeline_bytes(blocks) / 4];
    gpu.read(&buf, 0, &mut records)?;
    if records.iter().all(|&w| w == 0) {
        return Ok(None);
    }
    let header = [
        TIMELINE_MAGIC,
        blocks as u32,
        TIMELINE_STREAMS as u32,
        TIMELINE_RECORDS as u32,
    ];
    let mut bytes: Vec<u8> = bytemuck::cast_slice(&header).to_vec();
    bytes.extend_from_slice(bytemuck::cast_slice(&records));
    std::fs::create_dir_all(dir)?;
    let path = dir.join(sh.timeline_name());
    std::fs::write(&path, bytes)?;
    Ok(Some(path))
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_line(sh: &Shape, dtype: Dtype, iters: usize, r: &Res<Measured>) -> String {
    let mut line = format!("{{{}", sh.json_key(dtype));
    match r {
        Ok(m) => {
            line += &format!(r#","iters":{iters},"us":{:.3}"#, m.us);
            match sh.kind {
                Kind::Prefill => line += &format!(r#","tflops":{:.2}"#, sh.flops() / m.us / 1e6),
                Kind::Decode => {
                    line += &format!(r#","gbps":{:.1}"#, sh.kv_bytes(ELEM_BYTES) / m.us / 1e3)
                }
            }
            match &m.max_err {
                Ok(e) => line += &format!(r#","max_err":{e:.3e}"#),
                Err(e) => {
                    line += &format!(r#","error":{}"#, json_string(&format!("wrong output: {e}")))
                }
            }
        }
        Err(e) => line += &format!(r#","error":{}"#, json_string(&e.to_string())),
    }
    line + "}"
}

/// Every selected shape in turn; false when one failed or gave a wrong output.
fn bench(o: &Options) -> Res<bool> {
    let gpu = Gpu::open(0).map_err(|e| format!("cannot open the GPU: {e}"))?;
    eprintln!(
        "flash-bench: {} ({}), {}, {:?} flush",
        gpu.chip.name,
        gpu.arch(),
        o.dtype.name(),
        o.flush
    );
    let flush = Flush::new(&gpu, o.flush)?;
    let mut all_ok = true;
    for sh in SHAPES.iter().filter(|s| o.selects(s)) {
        let r = measure(&gpu, sh, o, &flush);
        all_ok &= matches!(&r, Ok(m) if m.max_err.is_ok());
        println!("{}", json_line(sh, o.dtype, o.iters, &r));
        if let Some(dir) = &o.timeline {
            match record_timeline(&gpu, sh, o, dir, &flush) {
                Ok(Some(path)) => eprintln!("flash-bench: timeline in {}", path.display()),
                Ok(None) => eprintln!(
                    "flash-bench: no timeline for {}: it ran on a kernel without one",
                    sh.timeline_name()
                ),
                Err(e) => {
                    eprintln!("flash-bench: timeline of {}: {e}", sh.timeline_name());
                    all_ok = false;
                }
            }
        }
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    let o = match parse_args(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("flash-bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match bench(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("flash-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Option<Options>, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn arguments() {
        let o = args("").unwrap().unwrap();
        assert_eq!((o.dtype.name(), o.iters, o.warmup), ("bf16", 50, 10));
        assert!(o.kinds == [Kind::Prefill, Kind::Decode]);
        assert_eq!((o.flush, o.head_dim), (FlushKind::Write, None));
        let o =
            args("--dtype f16 --iters 7 --warmup 0 --shapes decode --flush read --head-dim 128")
                .unwrap()
                .unwrap();
        assert_eq!((o.dtype.name(), o.iters, o.warmup), ("f16", 7, 0));
        assert!(o.kinds == [Kind::Decode]);
        assert_eq!((o.flush, o.head_dim), (FlushKind::Read, Some(128)));
        assert!(o.timeline.is_none());
        let o = args("--timeline /tmp/t").unwrap().unwrap();
        assert_eq!(o.timeline.as_deref(), Some(Path::new("/tmp/t")));
        assert_eq!(args("--head-dim 64").unwrap().unwrap().head_dim, Some(64));
        assert!(args("--help").unwrap().is_none());
        for bad in [
            "--iters 0",
            "--iters x",
            "--dtype",
            "--shapes all",
            "--flush x",
            "--head-dim 96",
            "--shapes decode --head-dim 256",
            "--head-dim x",
            "--head-dim",
            "--timeline",
            "--x",
        ] {
            assert!(args(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn random_values_are_fixed_and_spread() {
        let a = random(300_000, 1, Dtype::Bf16);
        assert_eq!(a, random(300_000, 1, Dtype::Bf16));
        assert_ne!(a, random(300_000, 2, Dtype::Bf16));
        let v: Vec<f32> = a.iter().map(|&x| Dtype::Bf16.value(x)).collect();
        assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!(v.iter().any(|&x| x < -0.99) && v.iter().any(|&x| x > 0.99));
    }

    /// With equal scores a row is the mean of the values its position sees, and both query
    /// heads read the one KV head.
    #[test]
    fn reference_masks_and_groups() {
        let d = 16;
        let dtype = Dtype::F16;
        let mut sh = prefill(1, 2, 2, d, true);
        sh.hkv = 1;
        let v: Vec<f32> = (0..2 * d).map(|i| i as f32 / 8.0).collect();
        let host = Host {
            dtype,
            q: vec![dtype.bits(0.0); 2 * 2 * d],
            k: random(2 * d, 2, dtype),
            v: v.iter().map(|&x| dtype.bits(x)).collect(),
            scale: 0.25,
        };
        for head in 0..2 {
            assert_eq!(host.reference(&sh, 0, head), v[..d]);
            let mean: Vec<f32> = (0..d).map(|i| (v[i] + v[d + i]) / 2.0).collect();
            assert_eq!(host.reference(&sh, 1, head), mean);
            sh.causal = false;
            assert_eq!(host.reference(&sh, 0, head), mean);
            sh.causal = true;
        }
    }

    #[test]
    fn json_lines() {
        let sh = decode(1, 32, 8, 4096, 128);
        let err: Res<Measured> = Err("a \"quoted\"\nmessage".into());
        assert_eq!(
            json_line(&sh, Dtype::Bf16, 5, &err),
            concat!(
                r#"{"kind":"decode","b":1,"h":32,"hkv":8,"kv":4096,"d":128,"dtype":"bf16","#,
                r#""error":"a \"quoted\"\u000amessage"}"#
            )
        );
        let sh = prefill(1, 32, 4096, 128, true);
        let m: Res<Measured> = Ok(Measured {
            us: 1000.0,
            max_err: Ok(0.5),
        });
        assert_eq!(
            json_line(&sh, Dtype::Bf16, 5, &m),
            concat!(
                r#"{"kind":"prefill","b":1,"h":32,"hkv":32,"s":4096,"d":128,"causal":true,"#,
                r#""dtype":"bf16","iters":5,"us":1000.000,"tflops":137.44,"max_err":5.000e-1}"#
            )
        );
    }
}

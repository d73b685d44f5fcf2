//! The device: a context with one stream, raw device buffers, compiled kernels and launches.
//!
//! Kernels take raw device pointers and plain scalars, so a launch is a fixed list of
//! arguments that a CUDA graph can capture and replay; no launch allocates or synchronizes.
//! Buffers are plain `cuMemAlloc` allocations owned by [`DeviceBuffer`]. Every call binds the
//! context to the calling thread first, so a backend may move between threads.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytemuck::{Pod, Zeroable};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::chip::ChipConfig;
use crate::compile::{self, ModuleKey, ModuleSpec};
use crate::CudaError;

/// A device allocation; freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// The device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address `offset` bytes in; panics past the end (a bug in the caller).
    pub fn at(&self, offset: usize) -> u64 {
        assert!(
            offset <= self.bytes,
            "offset {offset} past {} bytes",
            self.bytes
        );
        self.ptr + offset as u64
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the pointer came from `malloc_sync` in this context and is freed once.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// One scalar or pointer argument of a launch, laid out as the kernel's parameter.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    F32(f32),
    I64(i64),
}

impl From<&DeviceBuffer> for Arg {
    fn from(b: &DeviceBuffer) -> Arg {
        Arg::Ptr(b.ptr())
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Arg {
        Arg::U32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Arg {
        Arg::F32(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::I64(v)
    }
}

/// A kernel entry point of a loaded module.
#[derive(Clone, Debug)]
pub struct Kernel {
    func: CudaFunction,
    name: String,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lets the kernel use up to `bytes` of dynamic shared memory (past the 48 KiB default).
    pub fn set_max_dynamic_smem(&self, bytes: usize) -> Result<(), CudaError> {
        self.func
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| CudaError::driver("raising the shared-memory limit", e))
    }
}

/// The GPU: context, the stream every launch goes to, the chip's tuning and the kernel cache.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub chip: ChipConfig,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    /// Launches now use programmatic dependent launch (see [`Gpu::set_dependent_launch`]).
    dependent: AtomicBool,
}

/// A CUDA tensor map (`CUtensorMap`), as a kernel parameter receives it: 128 opaque bytes
/// that describe a tensor in global memory to the tensor memory accelerator (Hopper and later),
/// aligned as CUDA 13 aligns them.
#[repr(C, align(128))]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct TensorMap(pub [u64; 16]);

impl Gpu {
    /// The tensor map of a 4-dimensional tensor of 2-byte elements at `base`: `dims` elements
    /// per dimension (innermost first, contiguous), `strides` bytes between consecutive indices
    /// of the three outer ones, copied in boxes of `boxes` elements laid out with the 128-byte
    /// swizzle of the wgmma operands (so `boxes[0]` is at most 64). Rows past a dimension's end
    /// read as zeros.
    pub fn tensor_map_u16(
        &self,
        base: u64,
        dims: [u64; 4],
        strides: [u64; 3],
        boxes: [u32; 4],
    ) -> Result<TensorMap, CudaError> {
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        let unit = [1u32; 4];
        // SAFETY: the map is aligned as the driver requires and the arrays hold the rank's
        // entries; the driver only encodes them (no memory at `base` is touched here).
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                4,
                base as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                unit.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result()
            .map_err(|e| CudaError::driver("encoding a tensor map", e))?;
        Ok(TensorMap(map.opaque))
    }

    /// Opens GPU `ordinal`. Fails cleanly (no panic) when the driver, NVRTC or the device is
    /// missing.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        crate::check_libraries()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("opening the GPU", e))?;
        // Graph capture of the decode step needs a non-default stream and no per-buffer
        // event tracking (which records events outside the capture).
        // SAFETY: this crate never shares buffers between streams; launches are ordered on the
        // one stream below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating a stream", e))?;
        let chip = ChipConfig::from_context(&ctx)?;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            chip,
            modules: Mutex::new(HashMap::new()),
            dependent: AtomicBool::new(false),
        }))
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Makes the context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("binding the context", e))
    }

    /// A zero-filled buffer of `bytes` bytes (at least one byte is allocated).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        self.bind()?;
        let n = bytes.max(1);
        // SAFETY: a plain allocation in the bound context, zeroed before use.
        let ptr = unsafe { result::malloc_sync(n) }.map_err(|e| CudaError::OutOfMemory {
            bytes: n,
            source: e,
        })?;
        let buf = DeviceBuffer {
            ptr,
            bytes,
            ctx: self.ctx.clone(),
        };
        // The clear goes on our stream (a plain cuMemsetD8 runs on the legacy stream, which our
        // non-blocking stream does not wait for, so it could land after a later write).
        // SAFETY: `n` bytes at `ptr` belong to the allocation above.
        unsafe { result::memset_d8_async(ptr, 0, n, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("clearing a buffer", e))?;
        self.sync()?;
        Ok(buf)
    }

    /// Blocks of `k` with `threads` threads and `smem` bytes of dynamic shared memory that fit
    /// on one SM at once.
    pub fn blocks_per_sm(&self, k: &Kernel, threads: u32, smem: usize) -> Result<usize, CudaError> {
        self.bind()?;
        k.func
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map(|n| n as usize)
            .map_err(|e| CudaError::driver("querying occupancy", e))
    }

    /// Whether the following launches may overlap their predecessors (programmatic dependent
    /// launch, where the chip allows it). Worth it for chains of small kernels such as a
    /// decode step, where it hides most of each launch's latency; large multi-wave kernels
    /// (prefill) lose by it, since early blocks of the next kernel crowd the SMs that free
    /// first.
    pub fn set_dependent_launch(&self, on: bool) {
        self.dependent
            .store(on && self.chip.dependent_launch, Ordering::Relaxed);
    }

    /// A new buffer holding `data`.
    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> Result<DeviceBuffer, CudaError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buf = self.alloc(bytes.len())?;
        self.write(&buf, 0, data)?;
        Ok(buf)
    }

    /// Copies `data` into `dst` at byte `offset`, ordered after the stream's earlier work.
    pub fn write<T: bytemuck::Pod>(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        data: &[T],
    ) -> Result<(), CudaError> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        if offset + bytes.len() > dst.bytes {
            return Err(CudaError::Bounds(format!(
                "write of {} bytes at {offset} into a buffer of {}",
                bytes.len(),
                dst.bytes
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range was checked above; the stream is synchronized before `data` can be
        // freed by the caller.
        unsafe {
            result::memcpy_htod_async(dst.ptr + offset as u64, bytes, self.stream.cu_stream())
                .map_err(|e| CudaError::driver("copying to the GPU", e))?;
        }
        self.sync()
    }

    /// Copies `out.len()` values from `src` at byte `offset`, after the stream's work.
    pub fn read<T: bytemuck::Pod>(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        out: &mut [T],
    ) -> Result<(), CudaError> {
        self.read_ptr(
            src.ptr + offset as u64,
            src.bytes.saturating_sub(offset),
            out,
        )
    }

    /// Like [`Gpu::read`] from a raw address with `avail` readable bytes behind it.
    pub fn read_ptr<T: bytemuck::Pod>(
        &self,
        src: u64,
        avail: usize,
        out: &mut [T],
    ) -> Result<(), CudaError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        if bytes.len() > avail {
            return Err(CudaError::Bounds(format!(
                "read of {} bytes from {avail}",
                bytes.len()
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range was checked; the copy completes before the stream sync returns.
        unsafe {
            result::memcpy_dtoh_async(bytes, src, self.stream.cu_stream())
                .map_err(|e| CudaError::driver("copying from the GPU", e))?;
        }
        self.sync()
    }

    /// Copies `bytes` bytes between device addresses, on the stream (no synchronization).
    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: callers pass ranges inside their own buffers.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("copying on the GPU", e))
    }

    /// Waits for the stream's work and reports any error a kernel raised.
    pub fn sync(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(|e| CudaError::driver("running kernels", e))
    }

    /// The GPU's architecture name for NVRTC (`sm_90a` on Hopper).
    pub fn arch(&self) -> &str {
        &self.chip.arch
    }

    /// Kernel `name` of `file` (`"norm.cu"`) compiled with `defines`, compiling the module on
    /// first use (or loading it from the disk cache) unless [`Gpu::prepare`] has.
    pub fn kernel(
        &self,
        file: &str,
        name: &str,
        defines: &[(&str, String)],
    ) -> Result<Kernel, CudaError> {
        let key = ModuleKey::new(file, &self.chip.arch, defines);
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(&key) {
                Some(m) => m.clone(),
                None => {
                    let m = self.load(file, compile::compile(&key)?)?;
                    modules.insert(key, m.clone());
                    m
                }
            }
        };
        let func = module
            .load_function(name)
            .map_err(|e| CudaError::driver(&format!("finding kernel {name} in {file}"), e))?;
        Ok(Kernel {
            func,
            name: name.into(),
        })
    }

    /// Compiles the modules not loaded yet, several at once ([`compile::compile_many`]), and
    /// loads them, so that [`Gpu::kernel`] finds them.
    pub fn prepare(&self, modules: &[ModuleSpec]) -> Result<(), CudaError> {
        let keys = self.missing(modules);
        let compiled = compile::compile_many(&keys);
        let mut loaded = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        for (key, c) in keys.into_iter().zip(compiled) {
            let c = c?;
            if let Entry::Vacant(slot) = loaded.entry(key) {
                let m = self.load(&slot.key().file, c)?;
                slot.insert(m);
            }
        }
        Ok(())
    }

    /// How many of `modules` [`Gpu::prepare`] would compile: loaded neither in this context
    /// nor kept in the disk cache.
    pub fn uncompiled(&self, modules: &[ModuleSpec]) -> usize {
        self.missing(modules)
            .iter()
            .filter(|k| !compile::is_cached(k))
            .count()
    }

    /// The keys of `modules` not loaded in this context, each once.
    fn missing(&self, modules: &[ModuleSpec]) -> Vec<ModuleKey> {
        let loaded = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<ModuleKey> = Vec::new();
        for (file, defines) in modules {
            let key = ModuleKey::new(file, &self.chip.arch, defines);
            if !loaded.contains_key(&key) && !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// The modules loaded in this context.
    pub fn loaded_modules(&self) -> Vec<ModuleKey> {
        let loaded = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        loaded.keys().cloned().collect()
    }

    fn load(&self, file: &str, compiled: compile::Compiled) -> Result<Arc<CudaModule>, CudaError> {
        self.bind()?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.image))
            .map_err(|e| CudaError::driver(&format!("loading {file}"), e))
    }

    /// Launches `k` on the stream. Errors in the kernel itself surface at the next
    /// [`Gpu::sync`].
    pub fn launch(
        &self,
        k: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let mut values: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match *a {
                    Arg::Ptr(p) => v = p.to_ne_bytes(),
                    Arg::I64(x) => v = x.to_ne_bytes(),
                    Arg::I32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                    Arg::U32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                    Arg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                }
                v
            })
            .collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: each parameter points at 8 bytes holding the argument in the kernel's
        // parameter layout (little-endian, so 4-byte scalars sit in the first 4 bytes); the
        // values live until the call returns, which copies them.
        unsafe { self.launch_raw(k, grid, block, smem, 1, &mut params) }
    }

    /// Launches a kernel whose only parameter is a struct with `params`' `#[repr(C)]` layout.
    pub fn launch_with<T: bytemuck::Pod>(
        &self,
        k: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        params: &T,
    ) -> Result<(), CudaError> {
        self.launch_cluster_with(k, grid, block, smem, 1, params)
    }

    /// [`Gpu::launch_with`] in thread block clusters of `cluster` consecutive blocks along x
    /// (Hopper and later; at most 8), which `grid.0` must be a multiple of.
    pub fn launch_cluster_with<T: bytemuck::Pod>(
        &self,
        k: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        cluster: u32,
        params: &T,
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if cluster == 0 || cluster > 8 || !grid.0.is_multiple_of(cluster) {
            return Err(CudaError::Bounds(format!(
                "a grid of {} blocks in clusters of {cluster}",
                grid.0
            )));
        }
        let mut copy = *params;
        let mut ptrs = [&mut copy as *mut T as *mut c_void];
        // SAFETY: the one parameter points at a live copy of the struct, which the kernel
        // declares with the same C layout; the launch copies it before returning.
        unsafe { self.launch_raw(k, grid, block, smem, cluster, &mut ptrs) }
    }

    /// # Safety
    /// `params` must match the kernel's parameter list and stay valid for the call.
    unsafe fn launch_raw(
        &self,
        k: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        cluster: u32,
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        self.bind()?;
        let dependent = self.dependent.load(Ordering::Relaxed);
        let launched = if dependent || cluster > 1 {
            let mut attrs: [sys::CUlaunchAttribute; 2] = std::mem::zeroed();
            let mut n = 0;
            if dependent {
                // Programmatic stream serialization: the kernel may start while its
                // predecessor drains; it waits for the predecessor's writes itself
                // (`pdl_begin` in common.cuh). In a captured graph this becomes a
                // programmatic edge.
                attrs[n].id =
                    sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attrs[n].value.programmaticStreamSerializationAllowed = 1;
                n += 1;
            }
            if cluster > 1 {
                attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                attrs[n].value.clusterDim.x = cluster;
                attrs[n].value.clusterDim.y = 1;
                attrs[n].value.clusterDim.z = 1;
                n += 1;
            }
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block.0,
                blockDimY: block.1,
                blockDimZ: block.2,
                sharedMemBytes: smem,
                hStream: self.stream.cu_stream(),
                attrs: attrs.as_mut_ptr(),
                numAttrs: n as u32,
            };
            sys::cuLaunchKernelEx(
                &config,
                k.func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        } else {
            result::launch_kernel(
                k.func.cu_function(),
                grid,
                block,
                smem,
                self.stream.cu_stream(),
                params,
            )
        };
        launched.map_err(|e| CudaError::driver(&format!("launching {}", k.name), e))
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        self.bind()?;
        result::mem_get_info().map_err(|e| CudaError::driver("asking for free memory", e))
    }
}

//! Compiling one function body for several instruction sets and choosing at run time.
//!
//! The row-wise ops are plain Rust loops written so the compiler vectorises them; compiled for
//! baseline x86-64 they get SSE2 only. [`multiversion!`] wraps a function so that its body is
//! also compiled inside `#[target_feature]` wrappers for AVX-512 and AVX2 (the body is
//! `inline(always)`, so it is generated anew for each), and calls the best one the CPU runs,
//! as chosen by [`SimdLevel::current`] (so `AKUNU_CPU_SIMD` lowers these ops too).

/// `multiversion! { pub fn name(args) -> ret { body } }`.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::quant::SimdLevel::current() {
                    // SAFETY: the level is only chosen when the CPU has its features.
                    $crate::quant::SimdLevel::Avx512Vnni => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    $crate::quant::SimdLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::quant::SimdLevel::Portable => {}
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use multiversion;

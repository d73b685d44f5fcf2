//! Which instruction set the kernels use: detected once at run time, lowered on request with
//! `AKUNU_CPU_SIMD=portable|avx2|avx512`.

use std::sync::OnceLock;

/// A kernel family. Levels are ordered: each needs the features of the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Plain Rust, any target.
    Portable,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL with VNNI (`vpdpbusd`), plus the AVX2 set.
    Avx512Vnni,
}

impl SimdLevel {
    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 3] = [Self::Portable, Self::Avx2, Self::Avx512Vnni];

    /// The name in statistics and in `AKUNU_CPU_SIMD`: `"portable"`, `"avx2"`, `"avx512vnni"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512vnni",
        }
    }

    /// Whether this CPU runs the level.
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => {
                Self::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The levels this CPU runs, lowest first.
    pub fn available() -> Vec<SimdLevel> {
        Self::ALL.into_iter().filter(|l| l.is_available()).collect()
    }

    /// The level [`super::matmul`] uses: the best available, capped by `AKUNU_CPU_SIMD` if set
    /// (`portable`, `avx2`, `avx512`/`avx512vnni`; anything else is ignored). Read once.
    pub fn current() -> SimdLevel {
        static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            let best = Self::available()
                .into_iter()
                .max()
                .unwrap_or(Self::Portable);
            let cap = match std::env::var("AKUNU_CPU_SIMD").as_deref() {
                Ok("portable") => Self::Portable,
                Ok("avx2") => Self::Avx2,
                _ => Self::Avx512Vnni,
            };
            best.min(cap)
        })
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of the level in use, for the statistics line.
pub fn simd_level() -> &'static str {
    SimdLevel::current().name()
}

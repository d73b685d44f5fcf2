//! A count read from a file must not decide how much memory is reserved: a hostile file could
//! otherwise make the parser ask for many times its own size and abort the process. This binary
//! holds a single test so that its counting allocator sees no other test's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use akunu_formats::gguf::GgufFile;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged and only keeps statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: the caller's layout contract passes through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_hostile_entry_count_reserves_nothing_in_proportion() {
    // Four million metadata entries claimed, with exactly enough bytes for that many minimal
    // (13-byte) entries. The first two are empty keys, so parsing stops at the duplicate.
    let n: u64 = 4_000_000;
    let mut bytes = Vec::with_capacity(24 + n as usize * 13);
    bytes.extend_from_slice(b"GGUF");
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&n.to_le_bytes());
    bytes.resize(24 + n as usize * 13, 0);
    let file_len = bytes.len();

    PEAK.store(LIVE.load(Ordering::SeqCst), Ordering::SeqCst);
    let result = GgufFile::from_bytes(bytes);
    let peak = PEAK.load(Ordering::SeqCst);

    assert!(result.err().unwrap().to_string().contains("twice"));
    // The file itself is held; anything reserved per claimed entry would add hundreds of MB.
    assert!(
        peak < file_len + (1 << 20),
        "peak {peak} bytes while parsing a {file_len}-byte file"
    );
}

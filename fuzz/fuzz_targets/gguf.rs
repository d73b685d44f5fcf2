//! Any byte string either parses into a file whose every value and tensor can be read, or is
//! refused with an error.
#![no_main]

use akunu_formats::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for (_, value) in file.metadata() {
            let _ = value.to_owned_value();
            let _ = value.to_string();
        }
        for t in file.tensors() {
            assert_eq!(file.tensor_data(t).map(|d| d.len() as u64), Some(t.n_bytes));
        }
    }
});

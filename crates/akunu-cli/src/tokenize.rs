//! `akunu tokenize`: text to token ids, with the output format of llama.cpp's `llama-tokenize`.

use std::io::{Read, Write};
use std::path::Path;

use akunu_tokenizer::{EncodeOptions, Tokenizer};
use anyhow::{bail, Context, Result};

pub struct TokenizeOptions {
    pub ids: bool,
    pub no_bos: bool,
    pub no_parse_special: bool,
    pub show_count: bool,
    pub escape: bool,
}

/// Where the text comes from.
pub enum Input<'a> {
    Prompt(&'a str),
    File(&'a Path),
    Stdin,
}

/// A GGUF file (full model or vocabulary only), or a Hugging Face `tokenizer.json` / model
/// directory holding one.
pub fn load(path: &Path) -> Result<Tokenizer> {
    let hf = path.is_dir() || path.extension().is_some_and(|e| e == "json");
    let tok = if hf {
        Tokenizer::from_hf_path(path)
    } else {
        Tokenizer::from_gguf_path(path)
    };
    tok.with_context(|| format!("cannot build a tokenizer from {}", path.display()))
}

pub fn run(tok: &Tokenizer, input: Input, opts: &TokenizeOptions) -> Result<()> {
    let raw = match input {
        Input::Prompt(p) => p.as_bytes().to_vec(),
        Input::File(f) => {
            std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        Input::Stdin => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read standard input")?;
            buf
        }
    };
    let raw = if opts.escape { unescape(&raw) } else { raw };
    let text = match String::from_utf8(raw) {
        Ok(t) => t,
        Err(e) => bail!(
            "the input is not valid UTF-8 (at byte {})",
            e.utf8_error().valid_up_to()
        ),
    };
    let encode = EncodeOptions {
        add_special: tok.add_bos() && !opts.no_bos,
        parse_special: !opts.no_parse_special,
    };
    let ids = tok.encode(&text, encode);

    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if opts.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for &id in &ids {
            write!(out, "{id:6} -> '")?;
            out.write_all(tok.piece(id, true))?;
            writeln!(out, "'")?;
        }
    }
    if opts.show_count {
        writeln!(out, "Total number of tokens: {}", ids.len())?;
    }
    out.flush()?;
    Ok(())
}

/// C-style escapes, as llama.cpp's tools read them: `\n`, `\r`, `\t`, `\'`, `\"`, `\\` and
/// `\xHH` (any byte); anything else stays as written.
fn unescape(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' || i + 1 == s.len() {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let c = s[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'\'' | b'"' | b'\\' => out.push(c),
            b'x' => match (
                s.get(i).copied().and_then(hex),
                s.get(i + 1).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.extend_from_slice(b"\\x"),
            },
            other => out.extend_from_slice(&[b'\\', other]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes() {
        assert_eq!(unescape(br"a\nb\t\\\x41\q"), b"a\nb\t\\A\\q");
        assert_eq!(unescape(br"end\"), b"end\\");
        assert_eq!(unescape(br"\x4z \xe4\xbd\xa0"), "\\x4z 你".as_bytes());
    }
}

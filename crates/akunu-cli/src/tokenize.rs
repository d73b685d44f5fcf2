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
    let mut text = match String::from_utf8(raw) {
        Ok(t) => t,
        Err(e) => bail!(
            "the input is not valid UTF-8 (at byte {})",
            e.utf8_error().valid_up_to()
        ),
    };
    if opts.escape {
        text = unescape(&text);
    }
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

/// C-style escapes: `\n`, `\r`, `\t`, `\'`, `\"`, `\\` and `\xHH` (ASCII).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some('\\') => out.push('\\'),
            Some('x') => {
                let hex: String = (0..2)
                    .filter_map(|_| it.next_if(char::is_ascii_hexdigit))
                    .collect();
                match u8::from_str_radix(&hex, 16) {
                    Ok(b) if b.is_ascii() => out.push(char::from(b)),
                    _ => {
                        out.push_str("\\x");
                        out.push_str(&hex);
                    }
                }
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"a\nb\t\\\x41\q"), "a\nb\t\\A\\q");
        assert_eq!(unescape(r"end\"), "end\\");
    }
}

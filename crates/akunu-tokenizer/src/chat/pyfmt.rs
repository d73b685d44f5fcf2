//! Python's spelling of template values.
//!
//! Chat templates were written against Jinja2, where printing a value calls Python's `str()` and
//! `tojson` is `json.dumps`. minijinja spells the same values its own way (`none`, `true`,
//! `{"a": 1}`), so whatever reaches the output goes through these functions instead: `str()` and
//! `repr()` for printing, `json.dumps` for `tojson`. Floats use Python's shortest round-trip
//! `repr` (`1e-07`, `2.5e+20`, `100.0`).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use unicode_general_category::{get_general_category, GeneralCategory};

/// Deeper values are printed as `...` (repr) or refused (JSON); real data is far shallower, and
/// the limit keeps the recursion off the end of the stack.
const MAX_DEPTH: usize = 256;

/// Python's `str.isspace`: Rust's `White_Space` plus the four ASCII information separators.
pub(crate) fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// `str(value)`: strings as they are, undefined as nothing, everything else as `repr`.
pub(crate) fn py_str(value: &Value) -> String {
    if let Some(s) = value.as_str() {
        return s.to_owned();
    }
    if value.is_undefined() {
        return String::new();
    }
    let mut out = String::new();
    py_repr(value, &mut out, 0);
    out
}

/// `repr(value)`, with sequences as lists, tuples as tuples and maps as dicts.
fn py_repr(value: &Value, out: &mut String, depth: usize) {
    if depth > MAX_DEPTH {
        out.push_str("...");
        return;
    }
    match value.kind() {
        ValueKind::Undefined => out.push_str("Undefined"),
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => push_number(value, out, false),
        ValueKind::String => repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let (open, close) = if value.is_tuple() {
                ('(', ")")
            } else {
                ('[', "]")
            };
            out.push(open);
            let mut n = 0;
            if let Ok(items) = value.try_iter() {
                for item in items {
                    if n > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&item, out, depth + 1);
                    n += 1;
                }
            }
            // A one-element tuple keeps its comma: `(1,)`.
            out.push_str(if open == '(' && n == 1 { ",)" } else { close });
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&key, out, depth + 1);
                    out.push_str(": ");
                    let item = value.get_item(&key).unwrap_or_default();
                    py_repr(&item, out, depth + 1);
                }
            }
            out.push('}');
        }
        // Loops, namespaces, macros: Python would print an object address; minijinja's own
        // description is as good.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// An integer in decimal, a float as Python's `repr` (or JSON's `NaN`/`Infinity`).
fn push_number(value: &Value, out: &mut String, json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if json && !f.is_finite() {
        out.push_str(if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        });
    } else {
        out.push_str(&float_repr(f));
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed notation when the
/// decimal exponent is in [-4, 16), else `d.ddde±XX`; integral values keep a `.0`.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits, as `d.ddde-X`.
    let sci = format!("{f:e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return sci;
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    // Position of the decimal point relative to the first digit.
    let point = exp + 1;
    let mut out = String::from(sign);
    if (-3..=16).contains(&point) {
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-point) as usize));
            out.push_str(&digits);
        } else if point >= n {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (point - n) as usize));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// `repr(str)`: single quotes unless the text has a `'` and no `"`; backslash escapes for the
/// quote, `\`, `\t\n\r`, and `\x`/`\u`/`\U` for characters Python does not consider printable.
fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character: not a control, format, surrogate, private-use,
/// unassigned or separator character, except the plain space.
fn py_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::Surrogate
            | GeneralCategory::PrivateUse
            | GeneralCategory::Unassigned
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
            | GeneralCategory::SpaceSeparator
    )
}

/// The arguments of Python's `json.dumps` that transformers' `tojson` passes through.
#[derive(Debug, Clone)]
pub(crate) struct JsonStyle {
    /// `None` for one line; otherwise the text repeated once per nesting level.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl JsonStyle {
    /// `json.dumps` defaults for the given indent: `", "` on one line, `","` before a newline.
    pub fn new(indent: Option<String>) -> JsonStyle {
        let item_separator = if indent.is_some() { "," } else { ", " };
        JsonStyle {
            indent,
            item_separator: item_separator.into(),
            key_separator: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// `json.dumps(value, ...)`; values JSON has no spelling for are an error, as in Python.
pub(crate) fn json_dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    dump(value, style, 0, &mut out)?;
    Ok(out)
}

fn not_serializable(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {what} is not JSON serializable"),
    )
}

fn newline(style: &JsonStyle, level: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump(value: &Value, style: &JsonStyle, level: usize, out: &mut String) -> Result<(), Error> {
    if level > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply for tojson",
        ));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => push_number(value, out, true),
        ValueKind::String => json_str(value.as_str().unwrap_or_default(), style, out),
        // Lazy sequences (`reverse`, `.items()`, `range`) are iterators in Python, which
        // `json.dumps` refuses; `| list` first makes them lists in both.
        ValueKind::Iterable => return Err(not_serializable("iterator")),
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(style, level + 1, out);
                dump(item, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                // Code-point order, as Python sorts `str`.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(style, level + 1, out);
                json_str(key, style, out);
                out.push_str(&style.key_separator);
                dump(item, style, level + 1, out)?;
            }
            newline(style, level, out);
            out.push('}');
        }
        ValueKind::Undefined => return Err(not_serializable("Undefined")),
        kind => return Err(not_serializable(kind)),
    }
    Ok(())
}

/// Python's `json.dumps` turns `str`, `int`, `float`, `bool` and `None` keys into strings.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Number => {
            let mut s = String::new();
            push_number(key, &mut s, true);
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

/// A JSON string as Python writes it: `\"`, `\\`, `\b\f\n\r\t`, other controls as `\u00xx`;
/// everything else literal, or (`ensure_ascii`) non-ASCII as `\uxxxx` UTF-16 units.
fn json_str(s: &str, style: &JsonStyle, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.5, "0.5"),
            (0.1, "0.1"),
            (100.0, "100.0"),
            (123.456, "123.456"),
            (1e-4, "0.0001"),
            (1.5e-4, "0.00015"),
            (1e-5, "1e-05"),
            (1e-7, "1e-07"),
            (2.5e20, "2.5e+20"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e16, "1.2345e+16"),
            (9007199254740993.0, "9007199254740992.0"),
            (1e300, "1e+300"),
            (5e-324, "5e-324"),
            (-3.75, "-3.75"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn repr_matches_python() {
        let v = Value::from_pairs([
            ("a", Value::from("it's")),
            (
                "b",
                Value::from(vec![Value::from(true), Value::from(()), Value::from(1.0)]),
            ),
            ("c", Value::from("tab\t\"q\" \u{a0}\u{200b}\u{7f}é😀")),
        ]);
        assert_eq!(
            py_str(&v),
            r#"{'a': "it's", 'b': [True, None, 1.0], 'c': 'tab\t"q" \xa0\u200b\x7fé😀'}"#
        );
        assert_eq!(py_str(&Value::from("plain")), "plain");
        assert_eq!(py_str(&Value::UNDEFINED), "");
    }

    #[test]
    fn python_whitespace() {
        assert!(is_py_space('\x1c') && is_py_space('\u{3000}') && is_py_space('\u{85}'));
        assert!(!is_py_space('\u{200b}') && !is_py_space('x'));
    }
}

//! Metadata values: borrowed views decoded from a file, and owned values for writing.

use std::fmt;

use super::cursor::Cursor;
use super::{GgufError, MAX_ARRAY_DEPTH};

/// The GGUF metadata value type codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_code(code: u32) -> Option<Self> {
        use ValueType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The encoded size of one value of a fixed-size type.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take: used to reject element counts that
    /// could not fit in the rest of the file before looping over them.
    fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            fixed => fixed.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value borrowed from a file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An array borrowed from a file: its element type, its length and its encoded elements.
/// Elements were validated when the file was opened.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Array<'a> {
    elem: ValueType,
    len: u64,
    data: &'a [u8],
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type (or bool) widened to i128, so callers need not care which width a
    /// converter chose for a count.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            Value::Bool(v) => v.into(),
            _ => return None,
        })
    }

    /// Any float or integer type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<Array<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An owned copy, for writing or for keeping past the file.
    pub fn to_owned_value(&self) -> MetaValue {
        match *self {
            Value::U8(v) => MetaValue::U8(v),
            Value::I8(v) => MetaValue::I8(v),
            Value::U16(v) => MetaValue::U16(v),
            Value::I16(v) => MetaValue::I16(v),
            Value::U32(v) => MetaValue::U32(v),
            Value::I32(v) => MetaValue::I32(v),
            Value::F32(v) => MetaValue::F32(v),
            Value::Bool(v) => MetaValue::Bool(v),
            Value::String(s) => MetaValue::String(s.to_owned()),
            Value::Array(a) => MetaValue::Array(MetaArray {
                elem: a.elem,
                items: a.iter().map(|v| v.to_owned_value()).collect(),
            }),
            Value::U64(v) => MetaValue::U64(v),
            Value::I64(v) => MetaValue::I64(v),
            Value::F64(v) => MetaValue::F64(v),
        }
    }

    /// Decodes a value of type `ty` at the cursor, validating it (nested arrays and UTF-8
    /// included). `key` names the value in errors.
    pub(crate) fn read(
        cur: &mut Cursor<'a>,
        ty: ValueType,
        key: &str,
        depth: usize,
    ) -> Result<Value<'a>, GgufError> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(cur.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(cur.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(cur.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(cur.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(cur.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(cur.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(cur.array(what)?)),
            ValueType::Bool => Value::Bool(u8::from_le_bytes(cur.array(what)?) != 0),
            ValueType::String => Value::String(cur.string(what)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(cur.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(cur.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(cur.array(what)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        key: key.to_owned(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let code = cur.u32(|| format!("array element type of {key:?}"))?;
                let elem = ValueType::from_code(code).ok_or_else(|| GgufError::BadValueType {
                    key: key.to_owned(),
                    code,
                })?;
                let len = cur.u64(|| format!("array length of {key:?}"))?;
                let min_bytes = len.checked_mul(elem.min_size());
                if min_bytes.is_none_or(|b| b > cur.remaining() as u64) {
                    return Err(GgufError::Truncated {
                        what: format!("array {key:?} of {len} {elem} elements"),
                        offset: cur.pos() as u64,
                        needed: min_bytes.unwrap_or(u64::MAX),
                        available: cur.remaining() as u64,
                    });
                }
                let start = cur.pos();
                match elem.fixed_size() {
                    // The length check above already covered the exact size.
                    Some(size) => {
                        cur.take(len * size, what)?;
                    }
                    None => {
                        for _ in 0..len {
                            Value::read(cur, elem, key, depth + 1)?;
                        }
                    }
                }
                Value::Array(Array {
                    elem,
                    len,
                    data: cur.slice_from(start),
                })
            }
        })
    }
}

impl<'a> Array<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        // Validated: every element takes at least one byte of an in-memory file.
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        let mut cur = Cursor::new(self.data, 0);
        let elem = self.elem;
        (0..self.len).map_while(move |_| Value::read(&mut cur, elem, "", 1).ok())
    }

    /// The elements as strings, when this is an array of strings.
    pub fn strings(&self) -> Option<impl Iterator<Item = &'a str> + 'a> {
        (self.elem == ValueType::String).then(|| self.iter().filter_map(|v| v.as_str()))
    }

    fn fixed<const N: usize, T>(&self, ty: ValueType, conv: fn([u8; N]) -> T) -> Option<Vec<T>> {
        (self.elem == ty).then(|| {
            self.data
                .chunks_exact(N)
                .map(|c| {
                    let mut b = [0u8; N];
                    b.copy_from_slice(c);
                    conv(b)
                })
                .collect()
        })
    }

    /// The elements, when this is an array of f32.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.fixed(ValueType::F32, f32::from_le_bytes)
    }

    /// The elements, when this is an array of i32.
    pub fn to_i32_vec(&self) -> Option<Vec<i32>> {
        self.fixed(ValueType::I32, i32::from_le_bytes)
    }

    /// The elements, when this is an array of u32.
    pub fn to_u32_vec(&self) -> Option<Vec<u32>> {
        self.fixed(ValueType::U32, u32::from_le_bytes)
    }

    /// Integer elements of any width, widened.
    pub fn to_int_vec(&self) -> Option<Vec<i128>> {
        self.iter().map(|v| v.as_int()).collect()
    }
}

impl fmt::Display for Value<'_> {
    /// A one-line rendering: long strings and arrays are abbreviated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::String(s) => {
                const MAX: usize = 60;
                match s.char_indices().nth(MAX) {
                    Some((cut, _)) => write!(f, "{:?}… ({} bytes)", &s[..cut], s.len()),
                    None => write!(f, "{s:?}"),
                }
            }
            Value::Array(a) => {
                const SHOWN: usize = 4;
                write!(f, "[{} × {}", a.len, a.elem)?;
                if a.elem != ValueType::Array && !a.is_empty() {
                    f.write_str(": ")?;
                    for (i, v) in a.iter().take(SHOWN).enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{v}")?;
                    }
                    if a.len() > SHOWN {
                        f.write_str(", …")?;
                    }
                }
                f.write_str("]")
            }
        }
    }
}

/// An owned metadata value, for the writer.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// An owned array: all items must have the element type.
#[derive(Clone, Debug, PartialEq)]
pub struct MetaArray {
    pub elem: ValueType,
    pub items: Vec<MetaValue>,
}

impl MetaValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::String(_) => ValueType::String,
            MetaValue::Array(_) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// An array of strings.
    pub fn strings<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Self {
        MetaValue::Array(MetaArray {
            elem: ValueType::String,
            items: items
                .into_iter()
                .map(|s| MetaValue::String(s.into()))
                .collect(),
        })
    }

    /// An array of f32.
    pub fn f32s(items: impl IntoIterator<Item = f32>) -> Self {
        MetaValue::Array(MetaArray {
            elem: ValueType::F32,
            items: items.into_iter().map(MetaValue::F32).collect(),
        })
    }

    /// An array of i32.
    pub fn i32s(items: impl IntoIterator<Item = i32>) -> Self {
        MetaValue::Array(MetaArray {
            elem: ValueType::I32,
            items: items.into_iter().map(MetaValue::I32).collect(),
        })
    }
}

impl From<&str> for MetaValue {
    fn from(s: &str) -> Self {
        MetaValue::String(s.to_owned())
    }
}

impl From<String> for MetaValue {
    fn from(s: String) -> Self {
        MetaValue::String(s)
    }
}

impl From<u32> for MetaValue {
    fn from(v: u32) -> Self {
        MetaValue::U32(v)
    }
}

impl From<f32> for MetaValue {
    fn from(v: f32) -> Self {
        MetaValue::F32(v)
    }
}

impl From<bool> for MetaValue {
    fn from(v: bool) -> Self {
        MetaValue::Bool(v)
    }
}

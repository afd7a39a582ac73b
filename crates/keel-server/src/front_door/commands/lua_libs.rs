//! The libraries Redis gives scripts beside Lua's own: `cjson` (JSON through serde_json)
//! and `bit` (32-bit operations, as LuaBitOp's). Both are pure functions of their
//! arguments.

use mlua::{LightUserData, Lua, MultiValue, Table, Value};

/// Deepest nesting `cjson.encode` and `cjson.decode` accept (cjson's error beyond it).
const JSON_DEPTH_MAX: usize = 128;

/// Adds `cjson` and `bit` to the state's globals.
pub(crate) fn install(lua: &Lua) -> mlua::Result<()> {
    lua.globals().set("cjson", cjson(lua)?)?;
    lua.globals().set("bit", bit(lua)?)?;
    Ok(())
}

/// `cjson.null`: JSON's `null`, a light userdata as in cjson.
fn null() -> Value {
    Value::LightUserData(LightUserData(std::ptr::null_mut()))
}

fn cjson(lua: &Lua) -> mlua::Result<Table> {
    let cjson = lua.create_table()?;
    cjson.set("null", null())?;
    cjson.set(
        "encode",
        lua.create_function(|_, value: Value| {
            let json = to_json(&value, 0)?;
            serde_json::to_string(&json).map_err(mlua::Error::external)
        })?,
    )?;
    cjson.set(
        "decode",
        lua.create_function(|lua, text: mlua::String| {
            let json: serde_json::Value =
                serde_json::from_slice(&text.as_bytes()).map_err(mlua::Error::external)?;
            from_json(lua, &json, 0)
        })?,
    )?;
    Ok(cjson)
}

fn too_deep() -> mlua::Error {
    mlua::Error::runtime("Cannot serialise, excessive nesting")
}

/// A Lua value as JSON: a table whose keys are exactly 1..n is an array, any other
/// table an object (number keys written as text); an empty table is `{}`, as cjson's.
fn to_json(value: &Value, depth: usize) -> mlua::Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match value {
        Value::Nil => J::Null,
        Value::LightUserData(ud) if ud.0.is_null() => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(n) => J::from(*n),
        Value::Number(n) if n.fract() == 0.0 && n.abs() < 1e15 => J::from(*n as i64),
        Value::Number(n) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
        Value::String(s) => J::String(s.to_string_lossy()),
        Value::Table(table) => {
            if depth >= JSON_DEPTH_MAX {
                return Err(too_deep());
            }
            let len = table.raw_len();
            let pairs = table.clone().pairs::<Value, Value>().count();
            if len > 0 && pairs == len {
                let mut items = Vec::with_capacity(len);
                for i in 1..=len {
                    items.push(to_json(&table.raw_get::<Value>(i)?, depth + 1)?);
                }
                J::Array(items)
            } else {
                let mut object = serde_json::Map::new();
                for pair in table.clone().pairs::<Value, Value>() {
                    let (key, value) = pair?;
                    let key = match key {
                        Value::String(s) => s.to_string_lossy(),
                        Value::Integer(n) => n.to_string(),
                        Value::Number(n) => n.to_string(),
                        _ => {
                            return Err(mlua::Error::runtime(
                                "Cannot serialise table: table key must be a number or string",
                            ))
                        }
                    };
                    object.insert(key, to_json(&value, depth + 1)?);
                }
                J::Object(object)
            }
        }
        other => {
            return Err(mlua::Error::runtime(format!(
                "Cannot serialise {}: type not supported",
                other.type_name()
            )))
        }
    })
}

/// JSON as a Lua value: objects and arrays are tables, `null` is `cjson.null`.
fn from_json(lua: &Lua, json: &serde_json::Value, depth: usize) -> mlua::Result<Value> {
    use serde_json::Value as J;
    if depth >= JSON_DEPTH_MAX {
        return Err(mlua::Error::runtime("Found too many nested data structures"));
    }
    Ok(match json {
        J::Null => null(),
        J::Bool(b) => Value::Boolean(*b),
        J::Number(n) => Value::Number(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Value::String(lua.create_string(s)?),
        J::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, from_json(lua, item, depth + 1)?)?;
            }
            Value::Table(table)
        }
        J::Object(object) => {
            let table = lua.create_table_with_capacity(0, object.len())?;
            for (key, value) in object {
                table.raw_set(key.as_str(), from_json(lua, value, depth + 1)?)?;
            }
            Value::Table(table)
        }
    })
}

/// A number as LuaBitOp reads it: to a 32-bit integer, modulo 2^32.
fn tobit(n: f64) -> i32 {
    (n.trunc().rem_euclid(4_294_967_296.0) as u64 as u32) as i32
}

fn bit(lua: &Lua) -> mlua::Result<Table> {
    let bit = lua.create_table()?;
    let fold = |lua: &Lua, f: fn(i32, i32) -> i32| {
        lua.create_function(move |_, args: MultiValue| {
            let mut out: Option<i32> = None;
            for arg in args {
                let n = tobit(number(&arg)?);
                out = Some(out.map_or(n, |acc| f(acc, n)));
            }
            out.ok_or_else(|| {
                mlua::Error::runtime("bad argument #1 (number expected, got no value)")
            })
        })
    };
    bit.set("band", fold(lua, |a, b| a & b)?)?;
    bit.set("bor", fold(lua, |a, b| a | b)?)?;
    bit.set("bxor", fold(lua, |a, b| a ^ b)?)?;
    bit.set("tobit", lua.create_function(|_, n: f64| Ok(tobit(n)))?)?;
    bit.set("bnot", lua.create_function(|_, n: f64| Ok(!tobit(n)))?)?;
    bit.set("bswap", lua.create_function(|_, n: f64| Ok(tobit(n).swap_bytes()))?)?;
    let shift = |lua: &Lua, f: fn(i32, u32) -> i32| {
        lua.create_function(move |_, (n, by): (f64, f64)| Ok(f(tobit(n), (tobit(by) & 31) as u32)))
    };
    bit.set("lshift", shift(lua, |n, by| ((n as u32) << by) as i32)?)?;
    bit.set("rshift", shift(lua, |n, by| ((n as u32) >> by) as i32)?)?;
    bit.set("arshift", shift(lua, |n, by| n >> by)?)?;
    bit.set("rol", shift(lua, |n, by| (n as u32).rotate_left(by) as i32)?)?;
    bit.set("ror", shift(lua, |n, by| (n as u32).rotate_right(by) as i32)?)?;
    bit.set(
        "tohex",
        lua.create_function(|_, (n, digits): (f64, Option<f64>)| {
            let digits = digits.map_or(8, tobit);
            let (upper, width) = (digits < 0, digits.unsigned_abs().min(8) as usize);
            let value = tobit(n) as u32;
            let masked = if width == 8 { value } else { value & ((1u32 << (4 * width)) - 1) };
            Ok(match upper {
                true => format!("{masked:0width$X}"),
                false => format!("{masked:0width$x}"),
            })
        })?,
    )?;
    Ok(bit)
}

fn number(value: &Value) -> mlua::Result<f64> {
    match value {
        Value::Integer(n) => Ok(*n as f64),
        Value::Number(n) => Ok(*n),
        other => Err(mlua::Error::runtime(format!(
            "bad argument (number expected, got {})",
            other.type_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(source: &str) -> String {
        let lua = Lua::new();
        install(&lua).unwrap();
        lua.load(source).eval::<String>().unwrap()
    }

    #[test]
    fn cjson_round_trips_arrays_objects_and_null() {
        assert_eq!(eval("return cjson.encode({1, 2, 'x'})"), "[1,2,\"x\"]");
        assert_eq!(eval("return cjson.encode({a = 1})"), "{\"a\":1}");
        assert_eq!(eval("return cjson.encode({})"), "{}");
        assert_eq!(eval("return cjson.encode(1.5)"), "1.5");
        let decoded = "local t = cjson.decode('{\"a\":[1,null,{\"b\":true}]}') \
                       return tostring(t.a[1]) .. tostring(t.a[2] == cjson.null) .. tostring(t.a[3].b)";
        assert_eq!(eval(decoded), "1true true".replace(' ', ""));
        assert_eq!(eval("return cjson.encode(cjson.decode('[1,2,3]'))"), "[1,2,3]");
    }

    #[test]
    fn bit_operations_are_luabitops() {
        assert_eq!(eval("return tostring(bit.band(0xff, 0x0f, 0x3))"), "3");
        assert_eq!(eval("return tostring(bit.bor(1, 2, 4))"), "7");
        assert_eq!(eval("return tostring(bit.tobit(0xffffffff))"), "-1");
        assert_eq!(eval("return tostring(bit.lshift(1, 31))"), "-2147483648");
        assert_eq!(eval("return tostring(bit.rshift(-1, 28))"), "15");
        assert_eq!(eval("return tostring(bit.arshift(-256, 4))"), "-16");
        assert_eq!(eval("return bit.tohex(255)"), "000000ff");
        assert_eq!(eval("return bit.tohex(-1, -4)"), "FFFF");
        assert_eq!(eval("return tostring(bit.bnot(0))"), "-1");
    }
}

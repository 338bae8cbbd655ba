//! A table's CHECK constraints (`delta.constraints.*`), column invariants
//! (`delta.invariants`) and NOT NULL columns, checked by tributary on every row it writes, on
//! every path (append, rewrite, whole-file append), as the Delta protocol requires of
//! writers. The expressions are Spark SQL; they are parsed with `sqlparser` and evaluated
//! over Arrow arrays: column references, literals (numbers, strings, booleans, NULL,
//! `DATE '…'`, `TIMESTAMP '…'`), comparisons, `AND` / `OR` / `NOT`, arithmetic, `IS [NOT]
//! NULL`, `[NOT] BETWEEN`, `[NOT] IN (…)`. A constraint using anything else is refused by
//! name before any write. As in Spark, a row whose expression is false *or null* breaks it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::kernels::{boolean, cmp, numeric};
use arrow::datatypes::DataType;
use deltalake::DeltaTable;
use sqlparser::ast::{BinaryOperator, Expr, UnaryOperator, Value};

use crate::error::{Error, Result};

/// One rule every written row must satisfy.
#[derive(Debug, Clone)]
struct Rule {
    /// How the table names it: `CHECK amount_small`, `invariant of `x``, `NOT NULL `x``.
    name: String,
    /// The expression as the table has it (for messages).
    text: String,
    kind: RuleKind,
}

#[derive(Debug, Clone)]
enum RuleKind {
    Check(Box<Expr>),
    NotNull(String),
}

/// The rules of a table.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checks {
    rules: Vec<Rule>,
}

/// A row that breaks a rule: its index in the batch, the rule, and the values it read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Violation {
    pub(crate) row: usize,
    pub(crate) rule: String,
    pub(crate) text: String,
    /// The columns the rule reads.
    pub(crate) columns: Vec<String>,
}

impl Checks {
    /// The table's rules; a constraint tributary cannot evaluate is refused by name.
    pub(crate) fn of(table: &DeltaTable, label: &str) -> Result<Checks> {
        let Ok(snapshot) = table.snapshot() else {
            return Ok(Checks::default());
        };
        let mut rules = Vec::new();
        let mut constraints: Vec<(&String, &String)> = snapshot
            .metadata()
            .configuration()
            .iter()
            .filter(|(k, _)| k.starts_with("delta.constraints."))
            .collect();
        constraints.sort();
        for (k, sql) in constraints {
            let name = format!("CHECK {}", &k["delta.constraints.".len()..]);
            rules.push(parsed(label, name, sql)?);
        }
        for f in snapshot.schema().fields() {
            if !f.is_nullable() {
                rules.push(Rule {
                    name: format!("NOT NULL `{}`", f.name()),
                    text: format!("`{}` IS NOT NULL", f.name()),
                    kind: RuleKind::NotNull(f.name().clone()),
                });
            }
            if let Some(v) = f.metadata().get("delta.invariants") {
                let v = match v {
                    delta_kernel::schema::MetadataValue::String(s) => s.clone(),
                    other => serde_json::to_string(other).unwrap_or_default(),
                };
                let sql = invariant_sql(&v).ok_or_else(|| Error::Unsupported {
                    table: label.to_string(),
                    feature: format!("column `{}` has an invariant tributary cannot read ({v:?})", f.name()),
                    way_forward: "drop the invariant (Spark: ALTER TABLE … ALTER COLUMN … DROP NOT NULL, or rewrite the table without it), or write this table with Spark".to_string(),
                })?;
                rules.push(parsed(label, format!("invariant of `{}`", f.name()), &sql)?);
            }
        }
        Ok(Checks { rules })
    }

    /// The first row of `b` that breaks a rule, if any.
    pub(crate) fn first_violation(&self, b: &RecordBatch) -> Result<Option<Violation>> {
        for r in &self.rules {
            let ok: BooleanArray = match &r.kind {
                RuleKind::NotNull(c) => match column(b, c) {
                    Ok(a) if a.null_count() == 0 => continue,
                    Ok(a) => boolean::is_not_null(&a).map_err(Error::arrow)?,
                    Err(_) => continue,
                },
                RuleKind::Check(e) => {
                    let v = eval(e, b).map_err(|m| {
                        Error::internal(format!("evaluating {} ({}): {m}", r.name, r.text))
                    })?;
                    let v = expand(v, b.num_rows())?;
                    let v = arrow::compute::cast(&v, &DataType::Boolean).map_err(Error::arrow)?;
                    v.as_boolean().clone()
                }
            };
            if ok.null_count() == 0 && ok.false_count() == 0 {
                continue;
            }
            if let Some(row) = (0..ok.len()).find(|i| !ok.is_valid(*i) || !ok.value(*i)) {
                let mut columns = Vec::new();
                match &r.kind {
                    RuleKind::NotNull(c) => columns.push(c.clone()),
                    RuleKind::Check(e) => columns_of(e, &mut columns),
                }
                return Ok(Some(Violation {
                    row,
                    rule: r.name.clone(),
                    text: r.text.clone(),
                    columns,
                }));
            }
        }
        Ok(None)
    }
}

impl Checks {
    /// `b`'s rows checked (none for a table without rules); a row that breaks one refuses
    /// the files being applied (`files`), named with its key (`key`), not retryable.
    pub(crate) fn verify(
        &self,
        label: &str,
        files: &str,
        key: &[String],
        b: &RecordBatch,
    ) -> Result<()> {
        if self.rules.is_empty() || b.num_rows() == 0 {
            return Ok(());
        }
        let Some(v) = self.first_violation(b)? else {
            return Ok(());
        };
        let values = |names: &[String]| {
            names
                .iter()
                .filter_map(|k| {
                    let c = column(b, k).ok()?;
                    let value = match c.is_null(v.row) {
                        true => "NULL".to_string(),
                        false => arrow::util::display::array_value_to_string(&c, v.row).ok()?,
                    };
                    Some(format!("{k} = {}", crate::redact::value(&value)))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let read: Vec<String> = v
            .columns
            .iter()
            .filter(|c| !key.contains(c))
            .cloned()
            .collect();
        let row = match read.is_empty() {
            true => values(key),
            false => format!("{} ({})", values(key), values(&read)),
        };
        Err(Error::bad_input(
            files,
            crate::error::Location::File,
            format!("a row breaks {} ({}) of table `{label}` — the first: the row with {row}; writers check every row against the table's constraints, and nothing was applied. Fix the rows at the source and replay the file, or drop the constraint if it no longer holds (ALTER TABLE … DROP CONSTRAINT)", v.rule, v.text),
        ))
    }
}

/// The SQL of a column invariant (`{"expression": {"expression": "…"}}`).
fn invariant_sql(v: &str) -> Option<String> {
    let j: serde_json::Value = serde_json::from_str(v).ok()?;
    j.get("expression")?
        .get("expression")?
        .as_str()
        .map(str::to_string)
}

fn parsed(label: &str, name: String, sql: &str) -> Result<Rule> {
    let dialect = sqlparser::dialect::DatabricksDialect {};
    let expr = sqlparser::parser::Parser::new(&dialect)
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| e.to_string())
        .and_then(|e| supported(&e).map(|()| e));
    match expr {
        Ok(e) => Ok(Rule {
            name,
            text: sql.to_string(),
            kind: RuleKind::Check(Box::new(e)),
        }),
        Err(why) => Err(Error::Unsupported {
            table: label.to_string(),
            feature: format!("{name} ({sql}) uses {why}, which tributary does not evaluate (writers must check every row against it)"),
            way_forward: "nothing was written; drop the constraint (ALTER TABLE … DROP CONSTRAINT) or restate it with comparisons, AND/OR/NOT, arithmetic, IS NULL, BETWEEN or IN, then replay the files".to_string(),
        }),
    }
}

/// The columns `e` reads, in order, once each.
fn columns_of(e: &Expr, out: &mut Vec<String>) {
    let mut add = |name: &str| {
        if !out.iter().any(|c| c == name) {
            out.push(name.to_string());
        }
    };
    match e {
        Expr::Identifier(i) => add(&i.value),
        Expr::CompoundIdentifier(parts) => {
            if let Some(p) = parts.first() {
                add(&p.value)
            }
        }
        Expr::Nested(x) | Expr::IsNull(x) | Expr::IsNotNull(x) => columns_of(x, out),
        Expr::UnaryOp { expr, .. } => columns_of(expr, out),
        Expr::BinaryOp { left, right, .. } => {
            columns_of(left, out);
            columns_of(right, out);
        }
        Expr::Between {
            expr, low, high, ..
        } => {
            columns_of(expr, out);
            columns_of(low, out);
            columns_of(high, out);
        }
        Expr::InList { expr, list, .. } => {
            columns_of(expr, out);
            list.iter().for_each(|x| columns_of(x, out));
        }
        _ => {}
    }
}

/// Whether tributary evaluates every part of `e`; if not, the part it does not.
fn supported(e: &Expr) -> std::result::Result<(), String> {
    match e {
        Expr::Identifier(_) | Expr::Value(_) | Expr::TypedString(_) => Ok(()),
        Expr::CompoundIdentifier(parts) if parts.len() == 1 => Ok(()),
        Expr::Nested(x) | Expr::IsNull(x) | Expr::IsNotNull(x) => supported(x),
        Expr::UnaryOp { op, expr } => match op {
            UnaryOperator::Not | UnaryOperator::Minus | UnaryOperator::Plus => supported(expr),
            other => Err(format!("the operator `{other}`")),
        },
        Expr::BinaryOp { left, op, right } => {
            binary(op)?;
            supported(left)?;
            supported(right)
        }
        Expr::Between {
            expr, low, high, ..
        } => {
            supported(expr)?;
            supported(low)?;
            supported(high)
        }
        Expr::InList { expr, list, .. } => {
            supported(expr)?;
            list.iter().try_for_each(supported)
        }
        other => Err(format!("`{other}`")),
    }
}

#[derive(Clone, Copy)]
enum Op {
    Cmp(
        fn(
            &dyn arrow::array::Datum,
            &dyn arrow::array::Datum,
        ) -> std::result::Result<BooleanArray, arrow::error::ArrowError>,
    ),
    Num(
        fn(
            &dyn arrow::array::Datum,
            &dyn arrow::array::Datum,
        ) -> std::result::Result<ArrayRef, arrow::error::ArrowError>,
    ),
    And,
    Or,
}

fn binary(op: &BinaryOperator) -> std::result::Result<Op, String> {
    Ok(match op {
        BinaryOperator::Eq => Op::Cmp(cmp::eq),
        BinaryOperator::NotEq => Op::Cmp(cmp::neq),
        BinaryOperator::Lt => Op::Cmp(cmp::lt),
        BinaryOperator::LtEq => Op::Cmp(cmp::lt_eq),
        BinaryOperator::Gt => Op::Cmp(cmp::gt),
        BinaryOperator::GtEq => Op::Cmp(cmp::gt_eq),
        BinaryOperator::Plus => Op::Num(numeric::add),
        BinaryOperator::Minus => Op::Num(numeric::sub),
        BinaryOperator::Multiply => Op::Num(numeric::mul),
        BinaryOperator::Divide => Op::Num(numeric::div),
        BinaryOperator::Modulo => Op::Num(numeric::rem),
        BinaryOperator::And => Op::And,
        BinaryOperator::Or => Op::Or,
        other => return Err(format!("the operator `{other}`")),
    })
}

/// A value: a column of the batch (or computed from one), or a literal (one row); a
/// number literal keeps its text until it meets a typed value.
#[derive(Debug, Clone)]
enum Val {
    Col(ArrayRef),
    Lit(ArrayRef),
    Num(String),
}

type R<T> = std::result::Result<T, String>;

fn column(b: &RecordBatch, name: &str) -> R<ArrayRef> {
    if let Some(c) = b.column_by_name(name) {
        return Ok(c.clone());
    }
    // Spark resolves column names case-insensitively.
    let schema = b.schema();
    let found = schema
        .fields()
        .iter()
        .position(|f| f.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| format!("no column `{name}`"))?;
    Ok(b.column(found).clone())
}

fn eval(e: &Expr, b: &RecordBatch) -> R<Val> {
    Ok(match e {
        Expr::Identifier(i) => Val::Col(column(b, &i.value)?),
        Expr::CompoundIdentifier(parts) => Val::Col(column(b, &parts[0].value)?),
        Expr::Nested(x) => eval(x, b)?,
        Expr::Value(v) => literal(&v.value)?,
        Expr::TypedString(_) => typed_literal(e)?,
        Expr::IsNull(x) | Expr::IsNotNull(x) => {
            let a = expand(eval(x, b)?, b.num_rows()).map_err(|e| e.to_string())?;
            let r = match e {
                Expr::IsNull(_) => boolean::is_null(&a),
                _ => boolean::is_not_null(&a),
            };
            Val::Col(Arc::new(r.map_err(|e| e.to_string())?))
        }
        Expr::UnaryOp { op, expr } => unary(op, eval(expr, b)?, b)?,
        Expr::BinaryOp { left, op, right } => {
            apply(binary(op)?, eval(left, b)?, eval(right, b)?, b)?
        }
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let x = eval(expr, b)?;
            let ge = apply(Op::Cmp(cmp::gt_eq), x.clone(), eval(low, b)?, b)?;
            let le = apply(Op::Cmp(cmp::lt_eq), x, eval(high, b)?, b)?;
            negate(apply(Op::And, ge, le, b)?, *negated, b)?
        }
        Expr::InList {
            expr,
            list,
            negated,
        } => {
            let x = eval(expr, b)?;
            let mut any = Val::Lit(Arc::new(BooleanArray::from(vec![false])));
            for item in list {
                let eq = apply(Op::Cmp(cmp::eq), x.clone(), eval(item, b)?, b)?;
                any = apply(Op::Or, any, eq, b)?;
            }
            negate(any, *negated, b)?
        }
        other => return Err(format!("`{other}`")),
    })
}

/// A literal: a number (kept as text until its column's type is known), a string, a
/// boolean, NULL.
fn literal(v: &Value) -> R<Val> {
    Ok(match v {
        Value::Number(n, _) => Val::Num(n.to_string()),
        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => {
            Val::Lit(Arc::new(StringArray::from(vec![s.to_string()])))
        }
        Value::Boolean(v) => Val::Lit(Arc::new(BooleanArray::from(vec![*v]))),
        Value::Null => Val::Lit(Arc::new(arrow::array::NullArray::new(1))),
        other => return Err(format!("the literal `{other}`")),
    })
}

/// `DATE '…'` and `TIMESTAMP '…'` (other typed strings as text).
fn typed_literal(e: &Expr) -> R<Val> {
    let Expr::TypedString(t) = e else {
        return Err(format!("the literal `{e}`"));
    };
    let s = t
        .value
        .value
        .clone()
        .into_string()
        .ok_or_else(|| format!("the literal `{e}`"))?;
    let to = match t.data_type {
        sqlparser::ast::DataType::Date => DataType::Date32,
        sqlparser::ast::DataType::Timestamp(..) => {
            DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, Some("UTC".into()))
        }
        _ => DataType::Utf8,
    };
    let text: ArrayRef = Arc::new(StringArray::from(vec![s]));
    let typed = arrow::compute::cast(&text, &to).map_err(|e| e.to_string())?;
    Ok(Val::Lit(typed))
}

/// `+x`, `-x` (a number literal negated as text), `NOT x`.
fn unary(op: &UnaryOperator, v: Val, b: &RecordBatch) -> R<Val> {
    Ok(match (op, v) {
        (UnaryOperator::Plus, v) => v,
        (UnaryOperator::Minus, Val::Num(n)) => Val::Num(match n.strip_prefix('-') {
            Some(p) => p.to_string(),
            None => format!("-{n}"),
        }),
        (UnaryOperator::Minus, v) => {
            let a = expand(v, b.num_rows()).map_err(|e| e.to_string())?;
            Val::Col(numeric::neg(&a).map_err(|e| e.to_string())?)
        }
        (_, v) => {
            let a = as_bool(v, b.num_rows())?;
            Val::Col(Arc::new(boolean::not(&a).map_err(|e| e.to_string())?))
        }
    })
}

fn negate(v: Val, negated: bool, b: &RecordBatch) -> R<Val> {
    if !negated {
        return Ok(v);
    }
    let a = as_bool(v, b.num_rows())?;
    Ok(Val::Col(Arc::new(
        boolean::not(&a).map_err(|e| e.to_string())?,
    )))
}

fn as_bool(v: Val, n: usize) -> R<BooleanArray> {
    let a = expand(v, n).map_err(|e| e.to_string())?;
    let a = arrow::compute::cast(&a, &DataType::Boolean).map_err(|e| e.to_string())?;
    Ok(a.as_boolean().clone())
}

/// `v` as an array of `n` rows.
fn expand(v: Val, n: usize) -> Result<ArrayRef> {
    let one = match v {
        Val::Col(a) => return Ok(a),
        Val::Lit(a) => a,
        Val::Num(s) => number(&s).map_err(Error::internal)?,
    };
    arrow::compute::take(&one, &UInt32Array::from(vec![0u32; n]), None).map_err(Error::arrow)
}

/// A number literal in the narrowest of Int64, Float64.
fn number(s: &str) -> R<ArrayRef> {
    if let Ok(i) = s.parse::<i64>() {
        return Ok(Arc::new(arrow::array::Int64Array::from(vec![i])));
    }
    s.parse::<f64>()
        .map(|f| Arc::new(arrow::array::Float64Array::from(vec![f])) as ArrayRef)
        .map_err(|_| format!("the number `{s}`"))
}

/// Both sides in one type: a literal takes the other side's type (a number literal's text
/// cast exactly where it can be, else both as doubles); two columns, the left's.
fn unify(l: Val, r: Val) -> R<(Val, Val)> {
    let cast = |a: &ArrayRef, t: &DataType| arrow::compute::cast(a, t).map_err(|e| e.to_string());
    let text = |s: &str| -> ArrayRef { Arc::new(StringArray::from(vec![s.to_string()])) };
    Ok(match (l, r) {
        (Val::Num(a), Val::Num(b)) => (Val::Lit(number(&a)?), Val::Lit(number(&b)?)),
        (Val::Num(a), other) => {
            let (r, l) = unify(other, Val::Num(a))?;
            (l, r)
        }
        (Val::Col(c), Val::Num(s)) | (Val::Lit(c), Val::Num(s)) => {
            let t = c.data_type().clone();
            let exact = arrow::compute::cast_with_options(
                &text(&s),
                &t,
                &arrow::compute::CastOptions {
                    safe: false,
                    ..Default::default()
                },
            );
            match exact {
                Ok(lit) if t.is_numeric() => (Val::Col(c), Val::Lit(lit)),
                _ => {
                    let f = DataType::Float64;
                    (Val::Col(cast(&c, &f)?), Val::Lit(cast(&number(&s)?, &f)?))
                }
            }
        }
        (Val::Col(c), Val::Lit(l)) | (Val::Lit(l), Val::Col(c))
            if l.data_type() == &DataType::Null =>
        {
            let t = c.data_type().clone();
            (Val::Col(c), Val::Lit(cast(&l, &t)?))
        }
        (Val::Col(c), Val::Lit(l)) => {
            let t = c.data_type().clone();
            (Val::Col(c), Val::Lit(cast(&l, &t)?))
        }
        (Val::Lit(l), Val::Col(c)) => {
            let t = c.data_type().clone();
            (Val::Lit(cast(&l, &t)?), Val::Col(c))
        }
        (Val::Col(a), Val::Col(b)) => {
            let t = a.data_type().clone();
            (Val::Col(a), Val::Col(cast(&b, &t)?))
        }
        (Val::Lit(a), Val::Lit(b)) => {
            let t = a.data_type().clone();
            (Val::Lit(a), Val::Lit(cast(&b, &t)?))
        }
    })
}

fn apply(op: Op, l: Val, r: Val, b: &RecordBatch) -> R<Val> {
    let n = b.num_rows();
    if let Op::And | Op::Or = op {
        let (l, r) = (as_bool(l, n)?, as_bool(r, n)?);
        let out = match op {
            Op::And => boolean::and_kleene(&l, &r),
            _ => boolean::or_kleene(&l, &r),
        };
        return Ok(Val::Col(Arc::new(out.map_err(|e| e.to_string())?)));
    }
    let (l, r) = unify(l, r)?;
    let datum = |v: &Val| -> R<Box<dyn arrow::array::Datum>> {
        Ok(match v {
            Val::Col(a) => Box::new(a.clone()),
            Val::Lit(a) => Box::new(arrow::array::Scalar::new(a.clone())),
            Val::Num(s) => Box::new(arrow::array::Scalar::new(number(s)?)),
        })
    };
    let both_lit = matches!((&l, &r), (Val::Lit(_), Val::Lit(_)));
    let (dl, dr) = (datum(&l)?, datum(&r)?);
    let out: ArrayRef = match op {
        Op::Cmp(f) => Arc::new(f(dl.as_ref(), dr.as_ref()).map_err(|e| e.to_string())?),
        Op::Num(f) => f(dl.as_ref(), dr.as_ref()).map_err(|e| e.to_string())?,
        Op::And | Op::Or => unreachable!("handled above"),
    };
    Ok(match both_lit {
        true => Val::Lit(out),
        false => Val::Col(out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal128Array, Int32Array};
    use arrow::datatypes::{Field, Schema};

    fn batch() -> RecordBatch {
        let amount = Decimal128Array::from(vec![Some(3000), Some(50000), None])
            .with_precision_and_scale(10, 2)
            .unwrap();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, true),
                Field::new("amount", DataType::Decimal128(10, 2), true),
                Field::new("city", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 3])),
                Arc::new(amount),
                Arc::new(StringArray::from(vec![Some("Oslo"), Some("Rome"), None])),
            ],
        )
        .unwrap()
    }

    fn rows_failing(sql: &str) -> Vec<usize> {
        let rule = parsed("t", "CHECK c".into(), sql).unwrap();
        let b = batch();
        let checks = Checks { rules: vec![rule] };
        (0..b.num_rows())
            .filter(|i| checks.first_violation(&b.slice(*i, 1)).unwrap().is_some())
            .collect()
    }

    /// Spark's semantics: a row breaks a CHECK when its expression is false or null.
    #[test]
    fn comparisons_ranges_lists_and_nulls_are_evaluated_as_spark_does() {
        assert_eq!(rows_failing("amount < 100"), vec![1, 2]);
        assert_eq!(rows_failing("amount < 100 OR amount IS NULL"), vec![1]);
        assert_eq!(rows_failing("amount <= 500.00 AND id > 0"), vec![2]);
        assert_eq!(rows_failing("id BETWEEN 2 AND 3"), vec![0]);
        assert_eq!(rows_failing("id NOT IN (2)"), vec![1]);
        assert_eq!(rows_failing("city IN ('Oslo', 'Rome')"), vec![2]);
        assert_eq!(rows_failing("`city` <> 'Rome'"), vec![1, 2]);
        assert_eq!(rows_failing("id * 2 - 1 >= 3"), vec![0]);
        assert_eq!(rows_failing("NOT (id = 1)"), vec![0]);
        assert_eq!(rows_failing("amount > -1.5"), vec![2]);
        assert_eq!(rows_failing("ID > 1"), vec![0]);
    }

    #[test]
    fn a_constraint_using_what_tributary_does_not_evaluate_is_refused_by_name() {
        let e = parsed("t", "CHECK c".into(), "length(city) < 10").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("CHECK c") && text.contains("length"),
            "{text}"
        );
        assert!(!e.is_retryable());
    }

    /// The refusal names the constraint, the first row's key and the values it read.
    #[test]
    fn a_violation_names_the_rows_key_and_the_values_the_constraint_read() {
        let rule = parsed("t", "CHECK small".into(), "amount < 100").unwrap();
        let checks = Checks { rules: vec![rule] };
        let e = checks
            .verify("t", "f.csv", &["id".to_string()], &batch())
            .unwrap_err()
            .to_string();
        assert!(e.contains("CHECK small (amount < 100)"), "{e}");
        assert!(e.contains("id = 2 (amount = 500.00)"), "{e}");
        assert!(e.contains("f.csv"), "{e}");
    }

    #[test]
    fn an_invariant_reads_as_its_expression() {
        assert_eq!(
            invariant_sql(r#"{"expression":{"expression":"x > 3"}}"#).as_deref(),
            Some("x > 3")
        );
    }
}

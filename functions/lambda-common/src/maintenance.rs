//! The maintenance function's payload, parsed here (the library takes the request as a
//! value, `tributary::maintenance::Request`, and reads no event).
//!
//! Documented payloads (docs/operations.md, "The functions"): any scheduled event maintains
//! every table; `{"table": "name"}` or `{"tables": ["a", "b"]}` limits the run, `"force":
//! true` allows a VACUUM retention below the configured minimum, `{"reload": "name"}`
//! applies that table's DMS reload instead. What the deployed state machine sends:
//! `{"list": true}` (its first step), `{"table": "name"}` (one per table), `{"cuts": true}`
//! (its last step). Each field may also come inside `detail`, as EventBridge rules with
//! input transformers deliver it.

use serde::{Deserialize, Deserializer};
use serde_json::Value;
use url::Url;

use crate::events::{Announces, EventError};

/// What a maintenance invocation asks for. When a payload asks for several, the first of
/// list, cuts, reload, maintain is done (as the library always decided).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "Wire")]
pub enum MaintenanceRequest {
    /// `{"list": true}`: name the configured tables, maintain none.
    List,
    /// `{"cuts": true}`: move the watermarks of `tables` (every table when empty) and
    /// publish the groups' cuts.
    Cuts { tables: Vec<String> },
    /// `{"reload": "name"}`: apply that table's DMS reload.
    Reload { table: String },
    /// Maintain `tables` (every configured table when empty); `force`: allow a VACUUM
    /// retention below the configured minimum.
    Maintain { tables: Vec<String>, force: bool },
}

/// The request's fields as they arrive, at the top level or inside `detail`. A documented
/// field of another type (`{"table": 3}`, `"force": "yes"`) is refused by name rather than
/// read as no request: that would maintain every table instead of the one meant.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Fields {
    table: Option<String>,
    tables: Vec<String>,
    force: bool,
    reload: Option<String>,
    list: bool,
    cuts: bool,
}

#[derive(Debug, Deserialize)]
struct Wire {
    #[serde(flatten)]
    top: Fields,
    /// `detail` when it is an object (a scheduled event's `{}`, an input transformer's
    /// fields); anything else in `detail` is another event's and asks for nothing.
    #[serde(default, deserialize_with = "fields_if_object")]
    detail: Option<Fields>,
}

fn fields_if_object<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Fields>, D::Error> {
    match Value::deserialize(d)? {
        v @ Value::Object(_) => Fields::deserialize(v)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Ok(None),
    }
}

impl From<Wire> for MaintenanceRequest {
    fn from(w: Wire) -> Self {
        let levels = [Some(w.top), w.detail];
        let levels = levels.iter().flatten();
        let mut tables = Vec::new();
        let (mut force, mut list, mut cuts, mut reload) = (false, false, false, None);
        for f in levels {
            tables.extend(f.table.iter().cloned());
            tables.extend(f.tables.iter().cloned());
            force |= f.force;
            list |= f.list;
            cuts |= f.cuts;
            if let Some(table) = &f.reload {
                reload = Some(table.clone());
            }
        }
        tables.dedup();
        match (list, cuts, reload) {
            (true, ..) => MaintenanceRequest::List,
            (_, true, _) => MaintenanceRequest::Cuts { tables },
            (_, _, Some(table)) => MaintenanceRequest::Reload { table },
            _ => MaintenanceRequest::Maintain { tables, force },
        }
    }
}

impl MaintenanceRequest {
    /// The request a payload makes. A payload that is not a JSON object (no fields at all)
    /// is a scheduled event like any other: every table.
    pub fn parse(payload: &Value) -> Result<Self, EventError> {
        if !payload.is_object() {
            return Ok(Self::every_table());
        }
        Self::deserialize(payload).map_err(|e| EventError::Maintenance(e.to_string()))
    }

    /// Maintain every configured table, without force: what a scheduled event asks.
    pub fn every_table() -> Self {
        MaintenanceRequest::Maintain {
            tables: vec![],
            force: false,
        }
    }
}

impl From<MaintenanceRequest> for tributary::maintenance::Request {
    fn from(r: MaintenanceRequest) -> Self {
        use tributary::maintenance::Request;
        match r {
            MaintenanceRequest::List => Request {
                list: true,
                ..Request::default()
            },
            MaintenanceRequest::Cuts { tables } => Request {
                tables,
                cuts: true,
                ..Request::default()
            },
            MaintenanceRequest::Reload { table } => Request {
                reload: Some(table),
                ..Request::default()
            },
            MaintenanceRequest::Maintain { tables, force } => Request {
                tables,
                force,
                ..Request::default()
            },
        }
    }
}

/// A maintenance payload announces no object.
impl Announces for MaintenanceRequest {
    fn objects(&self) -> Vec<Url> {
        vec![]
    }
}

impl crate::Payload for MaintenanceRequest {
    fn parse(payload: Value) -> Result<Self, EventError> {
        MaintenanceRequest::parse(&payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> MaintenanceRequest {
        MaintenanceRequest::parse(&v).unwrap()
    }

    fn maintain(tables: &[&str], force: bool) -> MaintenanceRequest {
        MaintenanceRequest::Maintain {
            tables: tables.iter().map(|t| t.to_string()).collect(),
            force,
        }
    }

    #[test]
    fn the_documented_payloads_parse() {
        let scheduled = json!({"version":"0","id":"x","detail-type":"Scheduled Event",
            "source":"aws.events","time":"2022-10-25T22:00:00Z","resources":[],"detail":{}});
        assert_eq!(parse(scheduled), maintain(&[], false));
        assert_eq!(parse(json!({})), maintain(&[], false));
        assert_eq!(parse(json!({"table": "a"})), maintain(&["a"], false));
        assert_eq!(
            parse(json!({"tables": ["a", "b"], "force": true})),
            maintain(&["a", "b"], true)
        );
        assert_eq!(
            parse(json!({"detail": {"tables": ["a", "b"]}})),
            maintain(&["a", "b"], false)
        );
        assert_eq!(
            parse(json!({"table": "a", "detail": {"table": "b", "force": true}})),
            maintain(&["a", "b"], true)
        );
        assert_eq!(
            parse(json!({"table": "a", "tables": ["a", "b"]})),
            maintain(&["a", "b"], false),
            "a table named twice in a row once"
        );
        assert_eq!(
            parse(json!({"reload": "a"})),
            MaintenanceRequest::Reload { table: "a".into() }
        );
        assert_eq!(
            parse(json!({"detail": {"reload": "a"}})),
            MaintenanceRequest::Reload { table: "a".into() }
        );
        assert_eq!(parse(json!({"list": true})), MaintenanceRequest::List);
        assert_eq!(
            parse(json!({"cuts": true})),
            MaintenanceRequest::Cuts { tables: vec![] }
        );
        assert_eq!(
            parse(json!({"list": false, "cuts": false})),
            maintain(&[], false)
        );
    }

    /// The first of list, cuts, reload, maintain: what the library did with a request that
    /// asked for several.
    #[test]
    fn a_payload_asking_for_several_gets_the_first() {
        assert_eq!(
            parse(json!({"list": true, "cuts": true, "reload": "a"})),
            MaintenanceRequest::List
        );
        assert_eq!(
            parse(json!({"cuts": true, "reload": "a", "table": "b"})),
            MaintenanceRequest::Cuts {
                tables: vec!["b".into()]
            }
        );
        assert_eq!(
            parse(json!({"reload": "a", "table": "b", "force": true})),
            MaintenanceRequest::Reload { table: "a".into() }
        );
    }

    #[test]
    fn other_events_maintain_every_table_and_mistyped_fields_are_refused() {
        for other in [
            json!(null),
            json!("run"),
            json!([1]),
            json!({"detail": "x"}),
            json!({"detail": null}),
            json!({"detail-type": "Object Created", "detail": {"bucket": {"name": "b"}}}),
            json!({"table": null}),
        ] {
            assert_eq!(parse(other.clone()), maintain(&[], false), "{other}");
        }
        for bad in [
            json!({"table": 3}),
            json!({"tables": "a"}),
            json!({"tables": ["a", 1]}),
            json!({"force": "yes"}),
            json!({"reload": ["a"]}),
            json!({"detail": {"list": 1}}),
        ] {
            let e = MaintenanceRequest::parse(&bad).unwrap_err();
            assert!(matches!(e, EventError::Maintenance(_)), "{bad}: {e:?}");
            assert!(
                e.to_string().starts_with("not a maintenance request: "),
                "{e}"
            );
            let f = crate::FunctionError::from(e);
            assert_eq!(f.error_type(), "tributary.event");
        }
    }

    #[test]
    fn the_request_becomes_the_librarys() {
        use tributary::maintenance::Request;
        assert_eq!(Request::from(maintain(&[], false)), Request::default());
        let r = Request::from(maintain(&["a"], true));
        assert_eq!((r.tables, r.force), (vec!["a".to_string()], true));
        assert!(Request::from(MaintenanceRequest::List).list);
        let r = Request::from(MaintenanceRequest::Cuts {
            tables: vec!["a".into()],
        });
        assert!(r.cuts && r.tables == ["a"]);
        let r = Request::from(MaintenanceRequest::Reload { table: "a".into() });
        assert_eq!(r.reload.as_deref(), Some("a"));
        assert!(!r.list && !r.cuts && r.tables.is_empty());
    }
}

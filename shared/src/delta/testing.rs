//! Test helpers shared by unit tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::stream::BoxStream;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

/// The table `t` (key `id`, order key `ts`, under `dir`) after merging one CDC file of
/// `batch` (`Op`, `ts`, `id` and any other columns): its configuration and the table.
pub(crate) async fn merged_table(
    dir: &std::path::Path,
    batch: &arrow::array::RecordBatch,
) -> (crate::Config, deltalake::DeltaTable) {
    let text = crate::config::test_table("t", "raw/t/", "curated/t", "sequence_by = [\"ts\"]");
    let config = crate::Config::from_toml(&text, "test", Some(dir)).unwrap();
    let file = config.tables[0]
        .source
        .join("20240101-0000000001.parquet")
        .unwrap();
    crate::storage::Storage::new()
        .put(&file, crate::demo::to_parquet(batch).unwrap())
        .await
        .unwrap();
    let report = crate::Engine::new(config.clone()).process(&[file]).await;
    assert_eq!(report.failures().count(), 0, "{:?}", report.files);
    let table = crate::delta::open(
        config.tables[0].target.as_ref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    (config, table)
}

/// A table's rows as one batch, read by tributary's own scan: `columns` (every column when
/// empty), sorted by the `order_by` columns (ascending, nulls last, as SQL's `ORDER BY`),
/// which need not be among them.
pub(crate) async fn table_batch(
    table: &deltalake::DeltaTable,
    columns: &[&str],
    order_by: &[&str],
) -> arrow::array::RecordBatch {
    use arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn, SortOptions};
    let mut read = columns.to_vec();
    read.extend(order_by.iter().filter(|c| !columns.contains(c)));
    let scan = match columns.is_empty() {
        true => crate::delta::scan::Scan::default(),
        false => crate::delta::scan::Scan::columns(&read),
    };
    let batches = scan.rows(table).await.unwrap();
    let all = table.snapshot().unwrap().snapshot().arrow_schema();
    let schema = match (batches.first(), columns.is_empty()) {
        (Some(b), _) => b.schema(),
        (None, true) => all,
        (None, false) => Arc::new(arrow::datatypes::Schema::new(
            read.iter()
                .map(|c| all.field_with_name(c).unwrap().clone())
                .collect::<Vec<_>>(),
        )),
    };
    let b = arrow::compute::concat_batches(&schema, &batches).unwrap();
    let b = match order_by.is_empty() {
        true => b,
        false => {
            let keys: Vec<SortColumn> = order_by
                .iter()
                .map(|c| SortColumn {
                    values: b.column_by_name(c).unwrap().clone(),
                    options: Some(SortOptions {
                        descending: false,
                        nulls_first: false,
                    }),
                })
                .collect();
            take_record_batch(&b, &lexsort_to_indices(&keys, None).unwrap()).unwrap()
        }
    };
    match columns.is_empty() {
        true => b,
        false => {
            let at: Vec<usize> = columns
                .iter()
                .map(|c| b.schema().index_of(c).unwrap())
                .collect();
            b.project(&at).unwrap()
        }
    }
}

/// Each row's values as text, as SQL's `CAST(… AS VARCHAR)` writes them (arrow's display;
/// binary as hex); `None` for nulls.
pub(crate) fn text_values(b: &arrow::array::RecordBatch) -> Vec<Vec<Option<String>>> {
    use arrow::array::Array;
    use arrow::util::display::array_value_to_string;
    (0..b.num_rows())
        .map(|i| {
            b.columns()
                .iter()
                .map(|c| c.is_valid(i).then(|| array_value_to_string(c, i).unwrap()))
                .collect()
        })
        .collect()
}

/// An object store that counts the GET requests it serves (the S3 requests a read costs).
#[derive(Debug)]
pub(crate) struct Counting {
    inner: Arc<dyn ObjectStore>,
    gets: AtomicUsize,
}

impl Counting {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Counting {
            inner,
            gets: AtomicUsize::new(0),
        }
    }

    /// GET requests served so far.
    pub(crate) fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }
}

impl std::fmt::Display for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

// `get_ranges` is left to the trait's default: it coalesces the ranges and GETs each
// coalesced one through `get_opts`, as the S3 store does.
#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
    async fn rename_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// The places in production code where a test can run code of its own, to force an
/// interleaving of concurrent writers or a crash (the one test-hook mechanism; compiled
/// only for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Point {
    /// `merge_batch`, before the tombstones are opened (the table already loaded).
    BeforeTombstones,
    /// Between planning and the MERGE (or a whole-file append's commit).
    BeforeMerge,
    /// After the MERGE, before its deletes are confirmed.
    BetweenCommits,
    /// Before each compaction commit attempt (its partitions' folders as the argument).
    BeforeCompactionCommit,
}

type HookFn = dyn Fn(Vec<String>) -> futures::future::BoxFuture<'static, ()> + Send + Sync;

/// Code a test runs where production code reaches a [`Point`].
#[derive(Clone)]
pub(crate) struct Hook(Arc<HookFn>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Hook {
    /// A hook given the point's argument each time it is reached.
    pub(crate) fn each<F, Fut>(f: F) -> Hook
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let f = Arc::new(f);
        Hook(Arc::new(move |arg| {
            let f = f.clone();
            Box::pin(async move { f(arg).await })
        }))
    }

    /// A hook that runs `f` the first time it is reached only, and a flag saying it did
    /// (set before `f` runs: `f` may reach the point again).
    pub(crate) fn once<F, Fut>(f: F) -> (Hook, Arc<std::sync::atomic::AtomicBool>)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, f) = (fired.clone(), Arc::new(f));
        let hook = Hook::each(move |_| {
            let (flag, f) = (flag.clone(), f.clone());
            async move {
                if !flag.swap(true, Ordering::SeqCst) {
                    f().await;
                }
            }
        });
        (hook, fired)
    }

    /// A hook that runs `f` the `n`-th time it is reached (1-based) only.
    pub(crate) fn nth<F, Fut>(n: usize, f: F) -> Hook
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let calls = Arc::new(AtomicUsize::new(0));
        let f = Arc::new(f);
        Hook::each(move |_| {
            let (calls, f) = (calls.clone(), f.clone());
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) + 1 == n {
                    f().await;
                }
            }
        })
    }
}

/// The hooks of one holder: an engine's (a clone gets a copy of those set so far, as a
/// field would), or the process-wide ones of free functions ([`global`], by key).
#[derive(Default)]
pub(crate) struct Hooks(std::sync::Mutex<Vec<(Point, String, Hook)>>);

impl Clone for Hooks {
    fn clone(&self) -> Self {
        Hooks(std::sync::Mutex::new(self.all()))
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

impl Hooks {
    fn all(&self) -> Vec<(Point, String, Hook)> {
        self.0.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Run `hook` whenever `point` is reached (for `key`: `""` for an engine's own).
    pub(crate) fn set(&self, point: Point, key: &str, hook: Hook) {
        if let Ok(mut h) = self.0.lock() {
            h.push((point, key.to_string(), hook));
        }
    }

    /// Forget the hooks set for `key`.
    pub(crate) fn clear(&self, key: &str) {
        if let Ok(mut h) = self.0.lock() {
            h.retain(|(_, k, _)| k != key);
        }
    }

    /// Production code reached `point` (for `key`), with `arg`: run the hooks set for it.
    pub(crate) async fn reach(&self, point: Point, key: &str, arg: Vec<String>) {
        let hooks: Vec<Hook> = self
            .all()
            .into_iter()
            .filter(|(p, k, _)| *p == point && k == key)
            .map(|(_, _, h)| h)
            .collect();
        for h in hooks {
            (h.0)(arg.clone()).await;
        }
    }
}

/// The process-wide hooks, for code without an instance to hold them (maintenance); tests
/// run in parallel, so each uses a key of its own (a table label).
pub(crate) fn global() -> &'static Hooks {
    static GLOBAL: std::sync::OnceLock<Hooks> = std::sync::OnceLock::new();
    GLOBAL.get_or_init(Hooks::default)
}

//! The loaded models, each with its engine thread, and how a request's `model` finds one.
//!
//! Resolution: no name (or an empty one) means the first loaded model; otherwise the exact id,
//! then the id ignoring case, then the file name with or without `.gguf`. Anything else is a
//! 404 `model_not_found`: a typo never silently runs another model.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use akunu_core::Model;
use akunu_tokenizer::ChatTemplate;

use crate::engine::EngineHandle;
use crate::error::ApiError;

/// A model ready to serve.
pub struct LoadedModel {
    pub id: String,
    pub path: PathBuf,
    pub model: Arc<Model>,
    /// The chat template, or why the model has none usable (chat requests then get a 400).
    pub template: Result<ChatTemplate, String>,
    pub engine: EngineHandle,
    /// Unix seconds of loading.
    pub created: u64,
}

/// What a loader builds from a model file: the model, its chat template and a running engine.
pub struct Loaded {
    pub model: Arc<Model>,
    pub template: Result<ChatTemplate, String>,
    pub engine: EngineHandle,
}

/// Builds an engine for a model file (the binary decides the backend and its options).
pub type Loader = Arc<dyn Fn(&Path) -> anyhow::Result<Loaded> + Send + Sync>;

pub struct Registry {
    models: RwLock<Vec<Arc<LoadedModel>>>,
    loader: Loader,
}

impl Registry {
    pub fn new(loader: Loader) -> Self {
        Self {
            models: RwLock::new(Vec::new()),
            loader,
        }
    }

    pub fn list(&self) -> Vec<Arc<LoadedModel>> {
        self.models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn resolve(&self, name: Option<&str>) -> Result<Arc<LoadedModel>, ApiError> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let name = name.unwrap_or("").trim();
        if name.is_empty() {
            return models
                .first()
                .cloned()
                .ok_or_else(|| ApiError::overloaded("no model is loaded", 5));
        }
        let file_name = |m: &LoadedModel| {
            m.path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        models
            .iter()
            .find(|m| m.id == name)
            .or_else(|| models.iter().find(|m| m.id.eq_ignore_ascii_case(name)))
            .or_else(|| {
                models.iter().find(|m| {
                    let f = file_name(m);
                    f == name || f.strip_suffix(".gguf") == Some(name)
                })
            })
            .cloned()
            .ok_or_else(|| ApiError::model_not_found(name))
    }

    /// Loads `path` under `id` (default: the file stem). Blocking: call off the async workers.
    pub fn load(&self, path: &Path, id: Option<String>) -> Result<Arc<LoadedModel>, ApiError> {
        let id = id.unwrap_or_else(|| default_id(path));
        if id.is_empty() {
            // A request naming no model means the first one, so this id could never be asked
            // for (given as "", or the default of a file named `.gguf`).
            return Err(ApiError::param("id", "a model's id must not be empty"));
        }
        if self.list().iter().any(|m| m.id == id) {
            return Err(ApiError::conflict(format!(
                "a model with id `{id}` is already loaded"
            )));
        }
        if !path.is_file() {
            return Err(ApiError::param(
                "model",
                format!("{} is not a model file on the server", path.display()),
            ));
        }
        let loaded = (self.loader)(path)
            .map_err(|e| ApiError::param("model", format!("loading {}: {e:#}", path.display())))?;
        let entry = Arc::new(LoadedModel {
            id: id.clone(),
            path: path.to_path_buf(),
            model: loaded.model,
            template: loaded.template,
            engine: loaded.engine,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        if models.iter().any(|m| m.id == id) {
            return Err(ApiError::conflict(format!(
                "a model with id `{id}` is already loaded"
            )));
        }
        models.push(entry.clone());
        Ok(entry)
    }

    /// Takes the model out of service and ends its sequences. Blocking.
    pub fn unload(&self, id: &str) -> Result<(), ApiError> {
        let entry = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let at = models
                .iter()
                .position(|m| m.id == id)
                .ok_or_else(|| ApiError::model_not_found(id))?;
            models.remove(at)
        };
        entry.engine.stop("the model was unloaded");
        Ok(())
    }

    /// Stops every engine (server shutdown).
    pub fn stop_all(&self, why: &str) {
        for m in self.list() {
            m.engine.stop(why);
        }
    }
}

/// The id a model file gets by default: its file name without `.gguf`.
pub fn default_id(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    name.strip_suffix(".gguf")
        .map(str::to_string)
        .unwrap_or(name)
}

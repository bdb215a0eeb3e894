// Reading and writing deployment files (configs/*.yaml): YAML <-> DeploymentConfig.
//
// The file is a map of sections (model, devices, kv_cache, kv_store, scheduler, server, logging),
// each a map of keys; configs/default.yaml documents every key. A missing section or key keeps its
// default; a section written as null (`server:` with nothing under it) is empty. Strict, so a
// typo never passes silently:
//   - an unknown or repeated key is an error naming its full dotted path and listing the keys the
//     section allows;
//   - a value of the wrong type is an error naming the key and the expected type (integers are
//     decimal, booleans are true/false, byte sizes are like 512MiB / 4GiB, see parse_byte_size);
//   - null is accepted only for keys that are optional (kv_cache.gpu_memory_fraction,
//     kv_cache.cache_bytes) and means "not set".
// Error messages read "<source>:<line>:<column>: <dotted key> ..." where yaml-cpp knows the
// position, else "<source>: ...". Nothing here reads the environment (see resolve_api_keys).
//
// Thread-safe: free functions without shared state.
#pragma once

#include <string>
#include <string_view>

#include "strata/common/status.h"
#include "strata/config/deployment_config.h"

namespace strata::config {

// Parses `yaml_text` and validates the result (DeploymentConfig::validate()). `source_name` only
// labels messages (a path, "<stdin>"). INVALID_ARGUMENT for malformed YAML, unknown keys, wrong
// types and failed validation.
StatusOr<DeploymentConfig> parse_config(std::string_view yaml_text, std::string_view source_name);

// Reads the file at `path` and parse_config()s it. NOT_FOUND if it cannot be opened; otherwise as
// parse_config, with `path` as the source name.
StatusOr<DeploymentConfig> load_config_file(const std::string& path);

// Sets one key from a command-line style override ("scheduler.max_num_seqs", "32"). `value` is
// taken literally as the scalar the file would hold (no YAML quoting or comments), except that
//   - for an optional key, "null" or "~" clears it;
//   - for a list key (server.api_keys), it is a YAML flow sequence: "[key1, key2]", "[]".
// Applies the same type errors as the file and then validate_key(): INVALID_ARGUMENT naming the
// key for an unknown key (listing the allowed ones), a section or a wrong-typed or out-of-range
// value; `config` is unchanged on error. Constraints between keys are not checked, so a sequence
// of overrides may pass through a combination that only its last one resolves (set
// kv_cache.gpu_memory_fraction, then clear kv_cache.cache_bytes): the caller runs
// config.validate() after the last override.
Status apply_override(DeploymentConfig& config, std::string_view dotted_key,
                      std::string_view value);

// The YAML form of `config`, every key present (unset optional keys as null), in default.yaml's
// order. parse_config(to_yaml(c)) == c for every valid c. Contains server.api_keys verbatim:
// do not log it when keys are set inline.
std::string to_yaml(const DeploymentConfig& config);

}  // namespace strata::config

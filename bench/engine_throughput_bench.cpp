// In-process engine throughput: output tokens/s at concurrency 1..N on one model. Each level
// submits `concurrency` requests at once (prompt of --prompt-tokens real-text tokens, greedy,
// --output-tokens each with EOS ignored) and times until all finish.
//
// usage: engine_throughput_bench --model PATH [--concurrency 1,2,4,...] [--prompt-tokens 128]
//            [--output-tokens 64] [--device cpu] [--dtype float32] [--threads N] [--json PATH]
// bench/throughput_cpu.py runs it beside HF transformers and writes the report.

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "strata/engine/engine.h"
#include "strata/model/model_source.h"
#include "strata/tokenizer/tokenizer.h"

namespace {

struct Args {
  std::string model, json, device = "cpu", dtype = "float32", text_file;
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32, 64};
  int prompt_tokens = 128, output_tokens = 64, threads = 0;
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") args.model = value;
    else if (flag == "--json") args.json = value;
    else if (flag == "--device") args.device = value;
    else if (flag == "--dtype") args.dtype = value;
    else if (flag == "--text") args.text_file = value;
    else if (flag == "--concurrency") args.concurrency = parse_list(value);
    else if (flag == "--prompt-tokens") args.prompt_tokens = std::stoi(value);
    else if (flag == "--output-tokens") args.output_tokens = std::stoi(value);
    else if (flag == "--threads") args.threads = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (args.model.empty() || args.text_file.empty()) {
    std::fprintf(stderr, "usage: engine_throughput_bench --model PATH --text FILE [...]\n");
    return 2;
  }
  auto source = model::open_model_source(args.model);
  if (!source.ok()) return std::fprintf(stderr, "%s\n", source.status().to_string().c_str()), 1;
  auto tok = tokenizer::Tokenizer::from_gguf(*(*source)->gguf());
  if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().to_string().c_str()), 1;
  std::ifstream text_in(args.text_file);
  std::stringstream text;
  text << text_in.rdbuf();
  const std::vector<TokenId> text_ids = (*tok)->encode(text.str().substr(0, 400000), false);

  engine::EngineOptions options;
  options.executor.device = *executor::parse_device(args.device);
  options.executor.dtype = *executor::parse_dtype(args.dtype);
  options.executor.cpu_threads = args.threads;
  options.scheduler.max_num_seqs = 256;
  options.scheduler.max_num_batched_tokens = 2048;
  options.executor.enable_prefix_caching = false;  // distinct prompts anyway; the plain path
  auto engine = engine::Engine::create(std::move(source).value(), std::move(tok).value(), options);
  if (!engine.ok()) return std::fprintf(stderr, "%s\n", engine.status().to_string().c_str()), 1;

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%12s %14s %12s\n", "concurrency", "output tok/s", "seconds");
  for (int c : args.concurrency) {
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < c; ++i) {
      engine::GenerateRequest r;
      const size_t offset = (static_cast<size_t>(i) * 997) % (text_ids.size() - args.prompt_tokens);
      r.prompt_token_ids.assign(text_ids.begin() + offset,
                                text_ids.begin() + offset + args.prompt_tokens);
      r.sampling.temperature = 0;
      r.sampling.max_tokens = args.output_tokens;
      r.sampling.ignore_eos = true;
      streams.push_back(*(*engine)->submit(std::move(r)));
    }
    int64_t generated = 0;
    for (auto& s : streams) {
      while (auto out = s->next()) generated += static_cast<int64_t>(out->tokens.size());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%12d %14.1f %12.2f\n", c, generated / seconds, seconds);
    std::fflush(stdout);
    rows.push_back({{"concurrency", c}, {"output_tokens", generated}, {"seconds", seconds},
                    {"output_tokens_per_s", generated / seconds}});
  }
  if (!args.json.empty()) std::ofstream(args.json) << rows.dump(2) << "\n";
  return 0;
}

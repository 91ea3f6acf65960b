// Runs a GGUF model in llama.cpp (node-llama-cpp, CPU only, prebuilt binaries) over given
// token ids and prints as JSON what llama.cpp predicts after every position:
//   node llama_logprobs.mjs NODE_MODULES_DIR MODEL.gguf TOKEN,TOKEN,... [mmap]
// ("mmap": the model is mapped, never read into memory, so a file that cannot be mapped fails)
// {"arch": general.architecture as llama.cpp read it, "vocabulary": its tokenizer type,
//  "probs": [[p(token 0) .. p(token N-1)] per position]} — the softmax of the logits
// (temperature 1, no top-k/top-p/min-p cut).
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, modelPath, tokenList, load] = process.argv.slice(2);
const { getLlama } = await import(
  pathToFileURL(path.join(modules, "node-llama-cpp", "dist", "index.js")).href
);
const tokens = tokenList.split(",").map(Number);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel(
  load === "mmap" ? { modelPath, useMmap: true } : { modelPath },
);
const context = await model.createContext({ contextSize: 64, batchSize: 64, threads: 1 });
const sequence = context.getSequence();
const options = { temperature: 1, topK: 0, topP: 1, minP: 0 };
const input = tokens.map((t) => [t, { generateNext: { probabilities: true, options } }]);
const out = await sequence.controlledEvaluate(input);
const probs = out.map((o) => {
  const row = [];
  for (const [tok, p] of o?.next?.probabilities ?? new Map()) row[tok] = p;
  return row;
});
process.stdout.write(
  JSON.stringify({
    arch: model.fileInfo.metadata.general.architecture,
    vocabulary: model.vocabularyType,
    probs,
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();

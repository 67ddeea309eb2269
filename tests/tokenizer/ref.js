#!/usr/bin/env node
// ref.js - reference ids for every file of a corpus directory, from the same tokenizer.json /
// tokenizer_config.json that rw loads, by one of two implementations (npm packages installed in
// tools/tokenizer/node_modules by tools/install-deps.sh):
//   --impl js  the JavaScript tokenizer of @lenml/tokenizers (transformers.js's tokenizers);
//   --impl hf  Hugging Face `tokenizers` (the Rust library the trainer's Python uses), through its
//              official node binding, the npm package `tokenizers` (same version as the Python
//              wheel on the GPU machine).
// Run by tests/tokenizer (F6) and tools/bench (speed).
//
// usage: node ref.js TOKENIZER_DIR CORPUS_DIR OUT_JSON [--impl js|hf] [--time NAME] [--reps N]
//
// Each file's bytes become a JS string the way a UTF-8 decoder reads them (WHATWG TextDecoder:
// every maximal invalid subpart -> U+FFFD, a leading BOM kept). OUT_JSON gets
//   {"reference": "...", "texts": [{"name", "ids", "decoded", "decoded_skip"}],
//    "timing": {"name", "bytes", "tokens", "reps", "median_s", "load_s"}}
// decoded = decode(ids), decoded_skip = decode(ids, skip_special_tokens). --time NAME encodes
// that file --reps times more (after one warm-up) and reports the median.
"use strict";
const fs = require("fs");
const path = require("path");

function usage() {
  console.error("usage: node ref.js TOKENIZER_DIR CORPUS_DIR OUT_JSON [--impl js|hf] [--time NAME] [--reps N]");
  process.exit(2);
}

const argv = process.argv.slice(2);
if (argv.length < 3) usage();
const [tokDir, corpusDir, outPath] = argv;
let timeName = null;
let reps = 3;
let impl = "js";
for (let i = 3; i < argv.length; i++) {
  if (argv[i] === "--time" && i + 1 < argv.length) timeName = argv[++i];
  else if (argv[i] === "--impl" && i + 1 < argv.length) impl = argv[++i];
  else if (argv[i] === "--reps" && i + 1 < argv.length) reps = parseInt(argv[++i], 10);
  else usage();
}

// The packages live in tools/tokenizer/node_modules (tools/install-deps.sh puts them there).
const modDir = path.resolve(__dirname, "../../tools/tokenizer/node_modules");
const pkg = impl === "hf" ? "tokenizers" : impl === "js" ? "@lenml/tokenizers" : null;
if (!pkg) usage();
let lib;
try {
  lib = require(path.join(modDir, pkg));
} catch (e) {
  console.error(`ref.js: cannot load ${pkg} from ${modDir}: ${e.message}`);
  process.exit(3);
}
const version = JSON.parse(fs.readFileSync(path.join(modDir, pkg, "package.json"), "utf8")).version;

// One interface over both: encode(text) -> ids, decode(ids, skip) -> string (async for hf).
function loadJs() {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(
    fs.readFileSync(path.join(tokDir, "tokenizer_config.json"), "utf8"));
  const tok = lib.TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  return {
    encode: async (text) => tok.encode(text, { add_special_tokens: false }),
    decode: async (ids, skip) => (ids.length ? tok.decode(ids, { skip_special_tokens: skip }) : ""),
  };
}
function loadHf() {
  const tok = lib.Tokenizer.fromFile(path.join(tokDir, "tokenizer.json"));
  return {
    encode: async (text) => (await tok.encode(text, null, { addSpecialTokens: false })).getIds(),
    decode: async (ids, skip) => tok.decode(ids, skip),
  };
}

async function main() {
  const t0 = process.hrtime.bigint();
  const tok = impl === "hf" ? loadHf() : loadJs();
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;

  const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  const names = fs.readdirSync(corpusDir).sort();
  const texts = [];
  let timing = null;
  for (const name of names) {
    const text = decoder.decode(fs.readFileSync(path.join(corpusDir, name)));
    const ids = Array.from(await tok.encode(text));
    const decoded = await tok.decode(ids, false);
    const decodedSkip = await tok.decode(ids, true);
    texts.push({ name, ids, decoded, decoded_skip: decodedSkip });
    if (name === timeName) {
      const samples = [];
      for (let r = 0; r < reps; r++) {
        const a = process.hrtime.bigint();
        await tok.encode(text);
        samples.push(Number(process.hrtime.bigint() - a) / 1e9);
      }
      samples.sort((x, y) => x - y);
      timing = {
        name, bytes: Buffer.byteLength(text, "utf8"), tokens: ids.length, reps,
        median_s: samples[Math.floor(samples.length / 2)], load_s: loadS,
      };
    }
  }
  if (timeName && !timing) {
    console.error(`ref.js: --time ${timeName}: no such file in ${corpusDir}`);
    process.exit(2);
  }
  const out = { reference: `${pkg} ${version} (node ${process.version})`, texts, timing };
  fs.writeFileSync(outPath, JSON.stringify(out));
}

main().catch((e) => {
  console.error(`ref.js: ${e.stack || e}`);
  process.exit(1);
});

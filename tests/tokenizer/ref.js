#!/usr/bin/env node
// ref.js - reference ids from the JavaScript tokenizer of @lenml/tokenizers (transformers.js's
// tokenizers) for every file of a corpus directory, read from the same tokenizer.json /
// tokenizer_config.json that rw loads. Run by tests/tokenizer (F6) and tools/bench (speed).
//
// usage: node ref.js TOKENIZER_DIR CORPUS_DIR OUT_JSON [--time NAME] [--reps N]
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
  console.error("usage: node ref.js TOKENIZER_DIR CORPUS_DIR OUT_JSON [--time NAME] [--reps N]");
  process.exit(2);
}

const argv = process.argv.slice(2);
if (argv.length < 3) usage();
const [tokDir, corpusDir, outPath] = argv;
let timeName = null;
let reps = 3;
for (let i = 3; i < argv.length; i++) {
  if (argv[i] === "--time" && i + 1 < argv.length) timeName = argv[++i];
  else if (argv[i] === "--reps" && i + 1 < argv.length) reps = parseInt(argv[++i], 10);
  else usage();
}

// The package lives in tools/tokenizer/node_modules (tools/install-deps.sh puts it there).
const modDir = path.resolve(__dirname, "../../tools/tokenizer/node_modules");
let lib;
try {
  lib = require(path.join(modDir, "@lenml/tokenizers"));
} catch (e) {
  console.error(`ref.js: cannot load @lenml/tokenizers from ${modDir}: ${e.message}`);
  process.exit(3);
}
const version = JSON.parse(
  fs.readFileSync(path.join(modDir, "@lenml/tokenizers/package.json"), "utf8")).version;

const t0 = process.hrtime.bigint();
const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(
  fs.readFileSync(path.join(tokDir, "tokenizer_config.json"), "utf8"));
const tok = lib.TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
const loadS = Number(process.hrtime.bigint() - t0) / 1e9;

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const names = fs.readdirSync(corpusDir).sort();
const texts = [];
let timing = null;
for (const name of names) {
  const text = decoder.decode(fs.readFileSync(path.join(corpusDir, name)));
  const ids = tok.encode(text, { add_special_tokens: false });
  const decoded = ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "";
  const decodedSkip = ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "";
  texts.push({ name, ids, decoded, decoded_skip: decodedSkip });
  if (name === timeName) {
    const samples = [];
    for (let r = 0; r < reps; r++) {
      const a = process.hrtime.bigint();
      tok.encode(text, { add_special_tokens: false });
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
const out = { reference: `@lenml/tokenizers ${version} (node ${process.version})`, texts, timing };
fs.writeFileSync(outPath, JSON.stringify(out));

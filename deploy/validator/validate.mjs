// Validates Kubernetes manifests against the Kubernetes API schema, strictly:
// scripts/check-deploy runs it on every rendered overlay of deploy/.
//
// The schema is kubernetes-models' (the API's OpenAPI definitions compiled
// into ajv validators: required fields, types, enums, formats). Those
// validators accept properties the schema does not know, as the OpenAPI
// definitions allow them, but the API server drops them (or refuses them
// under strict field validation): a misspelled optional field such as
// `imagePulPolicy` would pass and be silently lost. So every object is
// handed to its validator behind a Proxy that records which properties the
// validator read. A compiled validator reads every property its schema
// declares, and every key of a map (labels, data, resources.limits); a
// property nobody read is one the schema does not have, and is reported as
// unknown. (An object the schema leaves free-form, a CRD's
// x-kubernetes-preserve-unknown-fields, would be reported too: deploy/ has
// none.)
//
// Usage: node deploy/validator/validate.mjs FILE... ("-" reads stdin)
// Prints one line per problem; exit 0 when every object is valid, 1 when
// any is not, 2 on a usage error.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { parseAllDocuments } from "yaml";

const require = createRequire(import.meta.url);
const modelsVersion = require("kubernetes-models/package.json").version;

// The model class of apiVersion/kind, or null when kubernetes-models has
// none (an unknown group, version or kind).
async function modelClass(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string") return null;
  if (!/^[a-z0-9.-]+(\/[a-z0-9]+)?$/.test(apiVersion)) return null;
  try {
    const module = await import(`kubernetes-models/${apiVersion}`);
    const cls = module[kind];
    return typeof cls === "function" && cls.apiVersion === apiVersion && cls.kind === kind
      ? cls
      : null;
  } catch {
    return null;
  }
}

// A copy of `value` whose objects record the properties read from them in
// `seen` (one entry per object: its path, its keys, the keys read).
function tracked(value, path, seen) {
  if (value === null || typeof value !== "object") return value;
  if (Array.isArray(value)) return value.map((v, i) => tracked(v, `${path}/${i}`, seen));
  const copy = {};
  for (const [key, v] of Object.entries(value)) copy[key] = tracked(v, `${path}/${key}`, seen);
  const read = new Set();
  seen.push({ path, keys: Object.keys(value), read });
  return new Proxy(copy, {
    get(target, property, receiver) {
      if (typeof property === "string") read.add(property);
      return Reflect.get(target, property, receiver);
    },
  });
}

// The unknown fields' paths, without those below another unknown field.
function unknownFields(seen) {
  const unknown = [];
  for (const { path, keys, read } of seen)
    for (const key of keys) if (!read.has(key)) unknown.push(`${path}/${key}`);
  unknown.sort();
  return unknown.filter((p) => !unknown.some((q) => p.startsWith(`${q}/`)));
}

// Problems of one object, as strings.
async function check(object) {
  if (object === null || typeof object !== "object" || Array.isArray(object))
    return ["not an object"];
  const cls = await modelClass(object.apiVersion, object.kind);
  if (cls === null)
    return [`no schema for apiVersion ${object.apiVersion} kind ${object.kind}`];
  const problems = [];
  const seen = [];
  try {
    cls.prototype.validate.call(tracked(object, "", seen));
  } catch (error) {
    // "data/spec must have required property containers, data/... must be integer"
    for (const part of String(error.message).split(/, (?=data[/ ])/))
      problems.push(part.replace(/^data/, ""));
  }
  for (const path of unknownFields(seen)) problems.push(`${path}: unknown field`);
  if (!object.metadata?.name && !object.metadata?.generateName)
    problems.push("/metadata: no name");
  return problems;
}

async function main(files) {
  if (files.length === 0) {
    console.error("usage: node deploy/validator/validate.mjs FILE... (- for stdin)");
    return 2;
  }
  let objects = 0;
  let bad = 0;
  for (const file of files) {
    const text = readFileSync(file === "-" ? 0 : file, "utf8");
    const documents = parseAllDocuments(text);
    for (const [index, document] of documents.entries()) {
      const where = `${file === "-" ? "stdin" : file}: document ${index + 1}`;
      if (document.errors.length > 0) {
        for (const e of document.errors) console.log(`${where}: YAML: ${e.message}`);
        bad++;
        continue;
      }
      const object = document.toJS();
      if (object === null) continue;
      objects++;
      const problems = await check(object);
      if (problems.length === 0) continue;
      bad++;
      const name = `${object?.kind ?? "?"} ${object?.metadata?.name ?? "?"}`;
      for (const p of problems) console.log(`${where} (${name}): ${p}`);
    }
  }
  console.log(
    `validate: ${objects - bad} of ${objects} objects valid against the Kubernetes schema ` +
      `(kubernetes-models ${modelsVersion}, unknown fields refused)`,
  );
  return bad === 0 && objects > 0 ? 0 : 1;
}

process.exitCode = await main(process.argv.slice(2));

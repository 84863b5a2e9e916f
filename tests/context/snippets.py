"""Small real programs, one per grammar, shared by the context tests."""

PROGRAMS = {
    "python": '''import os
from typing import Iterable


class Stats:
    """Running mean and variance (Welford)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def push(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    def variance(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


def summarize(xs: Iterable[float]) -> str:
    s = Stats()
    for x in xs:
        s.push(x)
    return f"n={s.n} mean={s.mean:.3f} var={s.variance():.3f} home={os.getcwd()}"
''',
    "javascript": """import { readFile } from "node:fs/promises";

export class Cache {
  constructor(limit) {
    this.limit = limit;
    this.items = new Map();
  }

  get(key) {
    const value = this.items.get(key);
    if (value !== undefined) {
      this.items.delete(key);
      this.items.set(key, value);
    }
    return value;
  }
}

export async function load(path) {
  const text = await readFile(path, "utf8");
  return JSON.parse(text);
}
""",
    "typescript": """import { EventEmitter } from "events";

export interface Job {
  id: number;
  run(): Promise<void>;
}

export class Queue extends EventEmitter {
  private jobs: Job[] = [];

  push(job: Job): void {
    this.jobs.push(job);
    this.emit("push", job.id);
  }

  async drain(): Promise<number> {
    let done = 0;
    while (this.jobs.length > 0) {
      const job = this.jobs.shift()!;
      await job.run();
      done++;
    }
    return done;
  }
}
""",
    "tsx": """import React from "react";

type Props = { items: string[]; title: string };

export function List({ items, title }: Props) {
  const sorted = [...items].sort();
  return (
    <section>
      <h2>{title}</h2>
      <ul>
        {sorted.map((item) => (
          <li key={item}>{item}</li>
        ))}
      </ul>
    </section>
  );
}
""",
    "go": """package main

import (
\t"fmt"
\t"strings"
)

type Counter struct {
\tcounts map[string]int
}

func (c *Counter) Add(words []string) {
\tfor _, w := range words {
\t\tc.counts[strings.ToLower(w)]++
\t}
}

func main() {
\tc := &Counter{counts: map[string]int{}}
\tc.Add([]string{"a", "B", "a"})
\tfmt.Println(c.counts)
}
""",
    "rust": """use std::collections::HashMap;

pub struct Index {
    words: HashMap<String, Vec<usize>>,
}

impl Index {
    pub fn new() -> Self {
        Index { words: HashMap::new() }
    }

    pub fn add(&mut self, line: usize, text: &str) {
        for word in text.split_whitespace() {
            self.words.entry(word.to_lowercase()).or_default().push(line);
        }
    }

    pub fn lookup(&self, word: &str) -> &[usize] {
        self.words.get(word).map(|v| v.as_slice()).unwrap_or(&[])
    }
}
""",
    "c": """#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int *data;
    size_t len;
} Vec;

static int sum(const Vec *v) {
    int total = 0;
    for (size_t i = 0; i < v->len; i++) {
        total += v->data[i];
    }
    return total;
}

int main(void) {
    int xs[] = {1, 2, 3};
    Vec v = {xs, 3};
    printf("%d\\n", sum(&v));
    return 0;
}
""",
    "cpp": """#include <string>
#include <vector>

namespace text {

class Tokenizer {
 public:
  explicit Tokenizer(char sep) : sep_(sep) {}

  std::vector<std::string> split(const std::string& s) const {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
      if (c == sep_) {
        out.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    out.push_back(cur);
    return out;
  }

 private:
  char sep_;
};

}  // namespace text
""",
    "java": """package demo;

import java.util.ArrayList;
import java.util.List;

public class Inventory {
    private final List<String> items = new ArrayList<>();

    public void add(String item) {
        if (item == null || item.isEmpty()) {
            throw new IllegalArgumentException("empty item");
        }
        items.add(item);
    }

    public int count() {
        return items.size();
    }
}
""",
    "lua": """local json = require("json")

local Stack = {}
Stack.__index = Stack

function Stack.new()
  return setmetatable({ items = {}, size = 0 }, Stack)
end

function Stack:push(x)
  self.size = self.size + 1
  self.items[self.size] = x
end

function Stack:pop()
  local x = self.items[self.size]
  self.items[self.size] = nil
  self.size = self.size - 1
  return x
end

return Stack
""",
    "bash": """#!/usr/bin/env bash
set -euo pipefail

log() {
  echo "[$(date +%H:%M:%S)] $*" >&2
}

backup() {
  local src="$1" dest="$2"
  for f in "$src"/*.conf; do
    cp "$f" "$dest/"
    log "copied $f"
  done
}

backup /etc /tmp/backup
""",
}

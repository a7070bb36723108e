#!/usr/bin/env python3
"""Write a seeded synthetic MovieLens-1M-format data set: ratings.dat and movies.dat.

The data has structure a recommender can learn, from ids and from text alike:
  - every movie has 1-3 of the 18 MovieLens genres, and its title is made of words tied to its
    genres (a horror film is "Midnight Curse", a western "Dusty Outlaw"), so the item text says
    what kind of film it is;
  - every user has a taste over genres (a few favourites), and rates movies drawn with weight
    exp(sharpness * taste . genres) * popularity, so users sharing tastes rate the same films;
  - the rating (1-5) rises with the user's affinity for the film; timestamps increase per user
    with random gaps, some of them 0 (ties), and each user's lines are shuffled, as in ML-1M,
    where the file order is not the time order.
MovieIDs have gaps (like ML-1M's 3883 movies numbered up to 3952), so ids must be remapped.

Standard library only; nothing is downloaded. The same arguments give the same files.

  scripts/make_movielens.py --users 300 --items 300 --ratings-per-user 20 --seed 1 \\
      --out data/movielens-sample
"""

import argparse
import math
import os
import random

GENRES = {
    "Action": ["Strike", "Fury", "Bullet", "Chase", "Mission", "Impact"],
    "Adventure": ["Quest", "Island", "Journey", "Treasure", "Expedition", "Voyage"],
    "Animation": ["Toon", "Doodle", "Pixel", "Sketch", "Cartoon", "Puppet"],
    "Children's": ["Puppy", "Kids", "Playground", "Teddy", "Lollipop", "Kitten"],
    "Comedy": ["Laughs", "Oops", "Goofy", "Blunder", "Prank", "Silly"],
    "Crime": ["Heist", "Mob", "Racket", "Alibi", "Felony", "Gangster"],
    "Documentary": ["Chronicle", "Portrait", "Truth", "Record", "Witness", "Inside"],
    "Drama": ["Tears", "Silence", "Promise", "Winter", "Letters", "Grace"],
    "Fantasy": ["Dragon", "Wizard", "Enchanted", "Realm", "Sorcery", "Elf"],
    "Film-Noir": ["Shadow", "Smoke", "Dame", "Rain", "Gumshoe", "Nocturne"],
    "Horror": ["Curse", "Blood", "Haunting", "Scream", "Midnight", "Grave"],
    "Musical": ["Melody", "Dance", "Song", "Rhythm", "Encore", "Chorus"],
    "Mystery": ["Riddle", "Clue", "Enigma", "Secret", "Puzzle", "Vanishing"],
    "Romance": ["Love", "Kiss", "Sweetheart", "Wedding", "Darling", "Valentine"],
    "Sci-Fi": ["Galaxy", "Robot", "Android", "Orbit", "Quantum", "Starship"],
    "Thriller": ["Danger", "Pursuit", "Trap", "Edge", "Panic", "Hostage"],
    "War": ["Battle", "Soldier", "Trench", "Front", "Platoon", "Siege"],
    "Western": ["Outlaw", "Dusty", "Saloon", "Sheriff", "Frontier", "Rider"],
}
NAMES = list(GENRES)
FIRST_TIMESTAMP = 956703932  # ML-1M's first rating (April 2000)


def make_movies(rng, count):
    movies = []
    movie_id = 0
    for _ in range(count):
        movie_id += 1 + (rng.random() < 0.1)  # ~10% of ids unused
        k = rng.choices([1, 2, 3], weights=[0.5, 0.35, 0.15])[0]
        genres = rng.sample(NAMES, k)
        words = [rng.choice(GENRES[g]) for g in genres[:2]]
        if len(words) == 1:
            words.insert(0, rng.choice(["The", "A", "Last", "Big", "Little"]))
        title = "{} ({})".format(" ".join(words), rng.randint(1930, 2000))
        popularity = math.exp(rng.gauss(0.0, 0.7))
        movies.append((movie_id, title, genres, popularity))
    return movies


def make_taste(rng):
    # Gamma(0.3) draws, normalised: a few genres carry most of the weight.
    raw = [rng.gammavariate(0.3, 1.0) + 1e-9 for _ in NAMES]
    total = sum(raw)
    return {g: r / total for g, r in zip(NAMES, raw, strict=True)}


def affinity(taste, genres):
    return sum(taste[g] for g in genres) / len(genres)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--ratings-per-user", type=int, default=20,
                        help="mean ratings per user (each user gets 50%%-150%% of it, at least 2)")
    parser.add_argument("--sharpness", type=float, default=12.0,
                        help="how strongly tastes steer which movies a user rates")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="directory to write the two files into")
    args = parser.parse_args()
    if args.users < 1 or args.items < 2 or args.ratings_per_user < 2:
        parser.error("need --users >= 1, --items >= 2, --ratings-per-user >= 2")

    rng = random.Random(args.seed)
    movies = make_movies(rng, args.items)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "movies.dat"), "w", encoding="utf-8", newline="\n") as f:
        for movie_id, title, genres, _ in movies:
            f.write("{}::{}::{}\n".format(movie_id, title, "|".join(genres)))

    with open(os.path.join(args.out, "ratings.dat"), "w", encoding="utf-8", newline="\n") as f:
        for user_id in range(1, args.users + 1):
            taste = make_taste(rng)
            mean = args.ratings_per_user
            n = min(len(movies), max(2, rng.randint(mean // 2, mean + mean // 2)))
            # Weighted sampling without replacement: Efraimidis-Spirakis keys u^(1/w), as logs.
            keyed = []
            for movie in movies:
                weight = math.exp(args.sharpness * affinity(taste, movie[2])) * movie[3]
                keyed.append((math.log(1.0 - rng.random()) / weight, movie))
            chosen = [m for _, m in sorted(keyed, key=lambda x: x[0], reverse=True)[:n]]
            timestamp = FIRST_TIMESTAMP + rng.randint(0, 30 * 86400)
            lines = []
            for movie_id, _, genres, _ in chosen:
                if rng.random() > 0.1:  # 10% of consecutive ratings share a timestamp
                    timestamp += rng.randint(1, 3 * 86400)
                score = 1 + 4 * min(1.0, 3 * affinity(taste, genres)) + rng.gauss(0, 0.6)
                rating = max(1, min(5, round(score)))
                lines.append(f"{user_id}::{movie_id}::{rating}::{timestamp}\n")
            rng.shuffle(lines)
            f.writelines(lines)


if __name__ == "__main__":
    main()

-- A school: teachers teach courses; students enroll in courses and get a grade (0-100, NULL if not graded yet).

CREATE TABLE teachers (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  department TEXT NOT NULL,
  hired_year INTEGER NOT NULL
);

CREATE TABLE courses (
  id INTEGER PRIMARY KEY,
  title TEXT NOT NULL,
  department TEXT NOT NULL,
  credits INTEGER NOT NULL,
  teacher_id INTEGER NOT NULL REFERENCES teachers(id)
);

CREATE TABLE students (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  year INTEGER NOT NULL, -- 1 to 4
  major TEXT NOT NULL,
  birth_year INTEGER NOT NULL
);

CREATE TABLE enrollments (
  student_id INTEGER NOT NULL REFERENCES students(id),
  course_id INTEGER NOT NULL REFERENCES courses(id),
  semester TEXT NOT NULL, -- '2024-spring' or '2024-fall'
  grade INTEGER -- NULL if not graded yet
);

INSERT INTO teachers (id, name, department, hired_year) VALUES
  (1, 'Helga Yilmaz', 'Mathematics', 2017),
  (2, 'Goran Nielsen', 'Physics', 2021),
  (3, 'Bruno Fischer', 'History', 2007),
  (4, 'Omar Wang', 'Biology', 2015),
  (5, 'Bruno Rossi', 'Computer Science', 2008),
  (6, 'Ivan Dubois', 'Mathematics', 2000),
  (7, 'Ximena Kowalski', 'Physics', 2014),
  (8, 'Yusuf Ali', 'History', 2002),
  (9, 'Jonas Rossi', 'Biology', 2016),
  (10, 'Bruno Dubois', 'Computer Science', 2017);

INSERT INTO courses (id, title, department, credits, teacher_id) VALUES
  (1, 'Calculus I', 'Mathematics', 5, 1),
  (2, 'Linear Algebra', 'Mathematics', 5, 1),
  (3, 'Statistics', 'Mathematics', 4, 6),
  (4, 'Mechanics', 'Physics', 5, 7),
  (5, 'Optics', 'Physics', 3, 2),
  (6, 'Quantum Basics', 'Physics', 4, 7),
  (7, 'Ancient Rome', 'History', 3, 3),
  (8, 'Modern Europe', 'History', 3, 3),
  (9, 'Genetics', 'Biology', 4, 4),
  (10, 'Ecology', 'Biology', 3, 9),
  (11, 'Cell Biology', 'Biology', 4, 9),
  (12, 'Programming', 'Computer Science', 5, 10),
  (13, 'Databases', 'Computer Science', 4, 5),
  (14, 'Algorithms', 'Computer Science', 5, 10),
  (15, 'Networks', 'Computer Science', 3, 10),
  (16, 'Art History', 'History', 2, 3),
  (17, 'Astronomy', 'Physics', 3, 2),
  (18, 'Number Theory', 'Mathematics', 3, 1),
  (19, 'Zoology', 'Biology', 3, 4),
  (20, 'Machine Learning', 'Computer Science', 4, 10);

INSERT INTO students (id, name, year, major, birth_year) VALUES
  (1, 'Quinn Dubois', 4, 'Biology', 2005),
  (2, 'Tara Khan', 2, 'Biology', 2005),
  (3, 'Ivan Smith', 4, 'History', 2003),
  (4, 'Erik Rossi', 3, 'Mathematics', 2005),
  (5, 'Freya Petrov', 3, 'Biology', 2003),
  (6, 'Gustav Lee', 2, 'Mathematics', 2005),
  (7, 'Nora Fischer', 3, 'History', 2003),
  (8, 'Freya Garcia', 4, 'Biology', 2003),
  (9, 'Helga Garcia', 3, 'Biology', 2005),
  (10, 'Delia Ali', 1, 'History', 2003),
  (11, 'Delia Yilmaz', 1, 'History', 2004),
  (12, 'Hana Lopez', 2, 'History', 2006),
  (13, 'Mateo Garcia', 3, 'Physics', 2005),
  (14, 'Fatima Costa', 4, 'Mathematics', 2006),
  (15, 'Bruno Garcia', 2, 'Mathematics', 2003),
  (16, 'Delia Wang', 4, 'Biology', 2004),
  (17, 'Goran Ali', 3, 'Biology', 2003),
  (18, 'Rosa Silva', 2, 'Physics', 2006),
  (19, 'Nora Berg', 4, 'History', 2005),
  (20, 'Emil Nielsen', 3, 'History', 2005),
  (21, 'Fatima Novak', 4, 'Physics', 2005),
  (22, 'Helga Petrov', 4, 'Computer Science', 2006),
  (23, 'Ximena Novak', 1, 'Physics', 2004),
  (24, 'Goran Petrov', 1, 'Physics', 2006),
  (25, 'Hana Lee', 2, 'Biology', 2005),
  (26, 'Ximena Sato', 4, 'Biology', 2004),
  (27, 'Freya Costa', 2, 'Physics', 2003),
  (28, 'Zoe Smith', 2, 'History', 2003),
  (29, 'Kenji Smith', 3, 'Physics', 2005),
  (30, 'Freya Fischer', 3, 'Computer Science', 2004);

INSERT INTO enrollments (student_id, course_id, semester, grade) VALUES
  (29, 1, '2024-fall', 66),
  (14, 17, '2024-fall', 57),
  (25, 2, '2024-fall', 76),
  (5, 17, '2024-spring', 90),
  (3, 9, '2024-fall', 64),
  (21, 15, '2024-spring', 59),
  (5, 2, '2024-fall', 88),
  (19, 16, '2024-fall', NULL),
  (30, 17, '2024-spring', 68),
  (26, 4, '2024-spring', 49),
  (27, 15, '2024-spring', NULL),
  (1, 5, '2024-spring', 98),
  (21, 10, '2024-fall', 80),
  (17, 14, '2024-spring', 47),
  (3, 10, '2024-spring', 77),
  (13, 9, '2024-spring', 78),
  (1, 18, '2024-fall', 69),
  (11, 8, '2024-spring', 55),
  (1, 14, '2024-spring', 59),
  (1, 7, '2024-fall', 83),
  (8, 14, '2024-fall', 54),
  (2, 11, '2024-fall', 63),
  (7, 1, '2024-spring', 87),
  (7, 16, '2024-spring', 59),
  (8, 15, '2024-fall', 88),
  (4, 16, '2024-spring', 97),
  (16, 14, '2024-spring', 43),
  (30, 13, '2024-spring', NULL),
  (20, 5, '2024-spring', 85),
  (6, 13, '2024-fall', 85),
  (24, 4, '2024-spring', 99),
  (11, 7, '2024-fall', 99),
  (2, 10, '2024-fall', 64),
  (11, 15, '2024-spring', 40),
  (9, 3, '2024-spring', 96),
  (18, 7, '2024-fall', 89),
  (27, 14, '2024-fall', NULL),
  (7, 12, '2024-spring', 68),
  (11, 12, '2024-spring', 70),
  (21, 14, '2024-fall', 80),
  (2, 13, '2024-spring', NULL),
  (26, 2, '2024-spring', 87),
  (29, 11, '2024-spring', 61),
  (9, 11, '2024-spring', 59),
  (24, 3, '2024-spring', NULL),
  (23, 15, '2024-fall', 64),
  (30, 14, '2024-fall', 48),
  (6, 1, '2024-fall', 87),
  (27, 5, '2024-fall', 60),
  (15, 12, '2024-spring', 78),
  (17, 7, '2024-spring', 50),
  (14, 3, '2024-fall', 70),
  (6, 14, '2024-fall', 44),
  (20, 3, '2024-fall', 66),
  (6, 8, '2024-spring', 69),
  (24, 18, '2024-spring', 82),
  (25, 10, '2024-fall', 76),
  (12, 9, '2024-fall', 52),
  (8, 6, '2024-fall', 49),
  (29, 7, '2024-fall', 65);
